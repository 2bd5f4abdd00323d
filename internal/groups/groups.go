// Package groups is gymtrace's model of NeMo Gym's span groups: the group
// table, the presets, the selection resolver, and the bitmask the kernel gate
// reads. It is the one source of truth for the group bits; bpf/common/groups.h
// is generated from it.
package groups

//go:generate go run ./gen -o ../../bpf/common/groups.h

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"
)

// Group is a span group, identified by its bit index in a Mask. The values are
// shared with the BPF programs (bpf/common/groups.h) and must never change:
// append new groups at the end.
type Group uint8

// The groups, in bit order.
const (
	Job        Group = 0
	Server     Group = 1
	HTTPClient Group = 2
	Rollout    Group = 3
	Agent      Group = 4
	ModelCall  Group = 5
	Verify     Group = 6
	Sandbox    Group = 7
	Checkpoint Group = 8
	Step       Group = 9
	Optimizer  Group = 10
	// Startup is Gym's newer startup group (gym.startup and its children).
	// Gym's newer code adds it to its default preset; gymtrace's presets stay
	// as the span-groups page defines them (StartupNote).
	Startup Group = 11

	// Count is the number of groups; every Group is below it.
	Count = 12
)

// Info describes one group as Gym's span-group page does.
type Info struct {
	Group     Group
	Name      string   // the name users write in span_groups, e.g. "model_call"
	Spans     []string // span names produced under it
	EmittedBy string   // where Gym's own telemetry emits it
	// Inherited is true for the training groups nemo-lens brings along
	// (checkpoint, step, optimizer): resolvable, reachable through "all",
	// but nothing in NeMo Gym emits them.
	Inherited bool
}

var table = [Count]Info{
	{Job, "job", []string{"gym.job"}, "Rollout collection, once per run", false},
	{Server, "server", []string{"GET /...", "POST /..."}, "FastAPI auto-instrumentation on every server", false},
	{HTTPClient, "http_client", []string{"HTTP POST", "HTTP GET"}, "server_utils.request(), once per outbound call", false},
	{Rollout, "rollout", []string{"gym.rollout"}, "The agent server's /run endpoint", false},
	{Agent, "agent", []string{"gym.agent.responses"}, "The agent server's /v1/responses endpoint", false},
	{ModelCall, "model_call", []string{"gym.model.chat_completions", "gym.model.responses", "gym.model.messages"}, "Model servers", false},
	{Verify, "verify", []string{"gym.verify"}, "Resources servers' /verify endpoint", false},
	{Sandbox, "sandbox", []string{"gym.sandbox.start", "gym.sandbox.exec"}, "Any sandbox provider", false},
	{Checkpoint, "checkpoint", nil, "Inherited from nemo-lens; nothing in NeMo Gym emits it", true},
	{Step, "step", nil, "Inherited from nemo-lens; nothing in NeMo Gym emits it", true},
	{Optimizer, "optimizer", nil, "Inherited from nemo-lens; nothing in NeMo Gym emits it", true},
	{Startup, "startup", []string{"gym.startup", "gym.startup.server", "gym.server.startup", "gym.server.startup.<stage>"},
		"The orchestrator and each server while they start (Gym's newer code; from outside: fork, exec, listen, first answer)", false},
}

// StartupNote says why the presets leave startup out although Gym's newer
// code puts it in its default: `gymtrace groups` and --help print it.
const StartupNote = "Gym's newer code adds startup to its default preset; gymtrace's presets stay as Gym's " +
	"span-groups page defines them (startup spans come once per server start, not per rollout: " +
	"select it by name, or through all)."

// All returns the group table in bit order. The slice is a copy.
func All() []Info {
	out := make([]Info, Count)
	for i, in := range table {
		in.Spans = append([]string(nil), in.Spans...)
		out[i] = in
	}
	return out
}

// Lookup returns the table entry of g; ok is false for a value out of range.
func Lookup(g Group) (Info, bool) {
	if int(g) >= Count {
		return Info{}, false
	}
	in := table[g]
	in.Spans = append([]string(nil), in.Spans...)
	return in, true
}

// Name returns the group's span_groups name, or "group(N)" out of range.
func (g Group) Name() string {
	if int(g) >= Count {
		return fmt.Sprintf("group(%d)", uint8(g))
	}
	return table[g].Name
}

// String is Name.
func (g Group) String() string { return g.Name() }

// Mask returns the single-bit mask of g.
func (g Group) Mask() Mask { return Mask(1) << g }

// ByName finds a group by its exact lower-case name. Presets are not groups:
// use Resolve for user input.
func ByName(name string) (Group, bool) {
	for _, in := range table {
		if in.Name == name {
			return in.Group, true
		}
	}
	return 0, false
}

// Mask is a set of groups, bit i set when Group(i) is selected. It has the
// layout of gt_config.mask and http_event.groups in the kernel.
type Mask uint64

// AllGroups is the mask of every group.
const AllGroups = Mask(1)<<Count - 1

// MaskOf builds a mask from groups.
func MaskOf(gs ...Group) Mask {
	var m Mask
	for _, g := range gs {
		m |= g.Mask()
	}
	return m
}

// Has reports whether g is in the set. This is the userspace gate: one shift
// and one AND, cheap enough to run before any span work.
func (m Mask) Has(g Group) bool { return m&(Mask(1)<<g) != 0 }

// Any reports whether m and o share a group.
func (m Mask) Any(o Mask) bool { return m&o != 0 }

// With returns m plus gs.
func (m Mask) With(gs ...Group) Mask { return m | MaskOf(gs...) }

// Without returns m minus gs.
func (m Mask) Without(gs ...Group) Mask { return m &^ MaskOf(gs...) }

// Len is the number of groups in the set.
func (m Mask) Len() int { return bits.OnesCount64(uint64(m & AllGroups)) }

// Groups returns the members in bit order.
func (m Mask) Groups() []Group {
	var out []Group
	for g := Group(0); g < Count; g++ {
		if m.Has(g) {
			out = append(out, g)
		}
	}
	return out
}

// Names returns the members' names sorted alphabetically, the order
// `gymtrace groups` prints them.
func (m Mask) Names() []string {
	out := make([]string, 0, m.Len())
	for _, g := range m.Groups() {
		out = append(out, g.Name())
	}
	sort.Strings(out)
	return out
}

// String renders the set as a span_groups spec that resolves back to it
// (sorted names joined by commas); the empty set is "".
func (m Mask) String() string { return strings.Join(m.Names(), ",") }

// Preset is a named selection.
type Preset struct {
	Name    string
	Mask    Mask
	UseWhen string
}

// The preset masks, as Gym defines them.
const (
	DefaultMask    = Mask(1)<<Job | Mask(1)<<Server | Mask(1)<<HTTPClient | Mask(1)<<Rollout
	PerRolloutMask = Mask(1)<<Server | Mask(1)<<HTTPClient | Mask(1)<<Rollout | Mask(1)<<Verify | Mask(1)<<Agent | Mask(1)<<ModelCall
	AllMask        = AllGroups
)

// DefaultSpec is the span_groups value used when none is given.
const DefaultSpec = "default"

var presets = []Preset{
	{"default", DefaultMask, "You want the shape of a run and the cross-process trace, without per-request detail."},
	{"per_rollout", PerRolloutMask, "You are debugging where a rollout spends its time. Each rollout is its own trace."},
	{"all", AllMask, "You are debugging something specific and volume does not matter."},
}

// Presets returns the presets in documentation order. The slice is a copy.
func Presets() []Preset { return append([]Preset(nil), presets...) }

// PresetByName finds a preset by its exact lower-case name.
func PresetByName(name string) (Preset, bool) {
	for _, p := range presets {
		if p.Name == name {
			return p, true
		}
	}
	return Preset{}, false
}

// ValidOptions returns every group and preset name, sorted: what a span_groups
// part may be.
func ValidOptions() []string {
	out := make([]string, 0, Count+len(presets))
	for _, in := range table {
		out = append(out, in.Name)
	}
	for _, p := range presets {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

// UnknownError is returned by Resolve for a part that names no group or preset.
type UnknownError struct {
	Part  string   // the offending part, trimmed and lower-cased
	Valid []string // every valid group and preset, sorted
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("unknown span group or preset %q; valid options: %s", e.Part, strings.Join(e.Valid, ", "))
}

// Resolve turns a span_groups spec into a mask with the nemo-lens resolver's
// semantics: split on commas, trim and lower-case each part, skip empty parts,
// union presets and group names. An empty spec selects no group. A part that
// names nothing is an *UnknownError, never silently dropped: a typo would
// otherwise look exactly like broken tracing.
func Resolve(spec string) (Mask, error) {
	var m Mask
	for _, raw := range strings.Split(spec, ",") {
		part := strings.ToLower(strings.TrimSpace(raw))
		if part == "" {
			continue
		}
		if p, ok := PresetByName(part); ok {
			m |= p.Mask
			continue
		}
		if g, ok := ByName(part); ok {
			m |= g.Mask()
			continue
		}
		return 0, &UnknownError{Part: part, Valid: ValidOptions()}
	}
	return m, nil
}

// JoinWarning returns the one-line warning for a selection that lacks server
// or http_client, the two halves of cross-process propagation, or "" when both
// are present.
func JoinWarning(m Mask) string {
	var missing []string
	for _, g := range []Group{Server, HTTPClient} {
		if !m.Has(g) {
			missing = append(missing, g.Name())
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("span groups without %s: traces will not join across processes (server and http_client are the two halves of trace joining; each process will produce its own disconnected trace)",
		strings.Join(missing, " and "))
}
