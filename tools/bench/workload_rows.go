//go:build linux

package main

import (
	"slices"
	"strings"
)

// wlConfig is one way of running the Gym-shaped workload.
type wlConfig struct {
	Name    string // row name in the table
	Traced  bool
	Spec    string // --span-groups
	NoGate  bool   // GYMTRACE_BENCH_NO_GATE=1
	Runtime string // "" the host's 3.11, default loop, h11; runtimeGym; runtimeSid, runtimeSidAsyncio
	Args    []string
	// Baseline: the row runs the --baseline binary (an older gymtrace),
	// in the same rounds as the row it twins (rowConfigs).
	Baseline bool
	// GymTel: the servers run Gym's own in-process telemetry
	// (test/stack/gymtel.py) with this exporter, "otlp" (http/protobuf to
	// the bench's sink) or "noop" (export does nothing), and Gym's span
	// groups GymSpec. Such a row is not traced by gymtrace; it has a stack
	// of its own and compares with its runtime's untraced row.
	GymTel, GymSpec string
	// FullOnly rows are left out of --short runs.
	FullOnly bool
}

// compared: the row has ratios against its untraced row.
func (c wlConfig) compared() bool { return c.Traced || c.GymTel != "" }

// stackKey names the stack a row runs on: one per runtime, and one per Gym
// telemetry setup (the servers are started with it).
func (c wlConfig) stackKey() string {
	if c.GymTel == "" {
		return c.Runtime
	}
	return c.Runtime + "/" + gymTelName(c.GymTel, c.GymSpec)
}

// gymTelName names the stack of a Gym-telemetry setup (exporter exp, span
// groups spec); gymTelArgs are its launcher flags.
func gymTelName(exp, spec string) string { return "gymtel-" + exp + "-" + spec }

func gymTelArgs(exp, spec string) []string {
	return []string{"--gym-telemetry", exp, "--gym-span-groups", spec}
}

// baselineSuffix names a row's twin run with the --baseline binary.
const baselineSuffix = ", baseline"

// rowConfigs is every workload row: workloadConfigs and, with a baseline
// binary, each traced row's twin right after it, so that the two binaries
// are interleaved in every round.
func rowConfigs(baseline bool) []wlConfig {
	if !baseline {
		return workloadConfigs
	}
	var out []wlConfig
	for _, c := range workloadConfigs {
		out = append(out, c)
		if c.Traced {
			b := c
			b.Name += baselineSuffix
			b.Baseline = true
			out = append(out, b)
		}
	}
	return out
}

// modeRows drops the full-only rows from a --short run.
func modeRows(configs []wlConfig, short bool) []wlConfig {
	if !short {
		return configs
	}
	return slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return c.FullOnly })
}

// The runtimes with a Debian root of their own (test/python/make-root.sh),
// each on a stack of its own whose rows compare with its own untraced row.
const (
	// runtimeGym: Gym's own runtime, CPython 3.13 with uvloop 0.21 and
	// httptools (Debian 13's).
	runtimeGym = "gym"
	// runtimeSid: Debian sid's CPython 3.14 with uvloop 0.23 and httptools,
	// the one root that packages the OTel Python SDK: gymtrace and Gym's own
	// telemetry side by side on the same interpreter and loop.
	runtimeSid = "sid"
	// runtimeSidAsyncio: the same root on the default asyncio loop (Gym's
	// fallback when uvloop is missing), full runs only.
	runtimeSidAsyncio = "sid-asyncio"
)

// gymTelRows are the "Gym telemetry" rows of a runtime: both presets the
// gymtrace rows run, with the OTLP exporter (A) and the no-op one (B).
func gymTelRows(runtime, suffix string, fullOnly bool) []wlConfig {
	var out []wlConfig
	for _, spec := range []string{"default", "per_rollout"} {
		for _, e := range []struct{ exp, name string }{{"otlp", "OTLP"}, {"noop", "no-op"}} {
			out = append(out, wlConfig{Name: "Gym telemetry " + spec + ", " + e.name + ", " + suffix, Runtime: runtime,
				GymTel: e.exp, GymSpec: spec, FullOnly: fullOnly})
		}
	}
	return out
}

var workloadConfigs = slices.Concat([]wlConfig{
	{Name: "untraced"},
	{Name: "groups off", Traced: true, Spec: ""},
	// Gym's metrics are on by default: every traced row has them, with a
	// Prometheus reader (the bench scrapes --metrics-addr); the sid family
	// has a row without them.
	{Name: "default", Traced: true, Spec: "default"},
	{Name: "per_rollout", Traced: true, Spec: "per_rollout"},
	{Name: "all", Traced: true, Spec: "all"},
	{Name: "verify, gate", Traced: true, Spec: "verify"},
	{Name: "verify, no gate", Traced: true, Spec: "verify", NoGate: true},
	// On a kernel whose self-test keeps injection off (FIONREAD in a
	// sockhash), the rows above run without it; this one measures what
	// the injection path (sys_enter decision, sockhash, sk_msg) costs.
	{Name: "default, injection forced", Traced: true, Spec: "default", Args: []string{"--inject-force"}},
	{Name: "untraced, Gym runtime", Runtime: runtimeGym},
	{Name: "default, Gym runtime", Traced: true, Spec: "default", Runtime: runtimeGym},
	{Name: "per_rollout, Gym runtime", Traced: true, Spec: "per_rollout", Runtime: runtimeGym},
	// gymtrace against Gym's own in-process telemetry, on sid's 3.14.
	{Name: "untraced, sid", Runtime: runtimeSid},
	{Name: "groups off, sid", Traced: true, Spec: "", Runtime: runtimeSid},
	{Name: "default, sid", Traced: true, Spec: "default", Runtime: runtimeSid},
	// Gym's metrics are on by default (every traced row has them, with a
	// Prometheus reader: the bench scrapes --metrics-addr); this row
	// measures what they cost, beside the Gym-telemetry rows whose side
	// includes its own metrics.
	{Name: "default, Gym metrics off, sid", Traced: true, Spec: "default", Runtime: runtimeSid, Args: []string{"--gym-metrics=false"}},
	// `default` without the GenAI walk (--genai=false): per program, what
	// the model bodies' walk costs (the twin row of the same name gives its
	// CPU share).
	{Name: "default, GenAI off, sid", Traced: true, Spec: "default", Runtime: runtimeSid, Args: []string{"--genai=false"}, FullOnly: true},
	{Name: "per_rollout, sid", Traced: true, Spec: "per_rollout", Runtime: runtimeSid},
	{Name: "all, sid", Traced: true, Spec: "all", Runtime: runtimeSid},
}, gymTelRows(runtimeSid, "sid", false), []wlConfig{
	{Name: "untraced, sid asyncio", Runtime: runtimeSidAsyncio, FullOnly: true},
	{Name: "default, sid asyncio", Traced: true, Spec: "default", Runtime: runtimeSidAsyncio, FullOnly: true},
	{Name: "per_rollout, sid asyncio", Traced: true, Spec: "per_rollout", Runtime: runtimeSidAsyncio, FullOnly: true},
}, gymTelRows(runtimeSidAsyncio, "sid asyncio", true))

// baseOf is the untraced configuration a configuration is compared with.
func baseOf(cfg wlConfig) string {
	switch cfg.Runtime {
	case runtimeGym:
		return "untraced, Gym runtime"
	case runtimeSid:
		return "untraced, sid"
	case runtimeSidAsyncio:
		return "untraced, sid asyncio"
	}
	return "untraced"
}

// pick keeps the rows a --configs filter names, and their untraced rows.
func pick(configs []wlConfig, filter string) []wlConfig {
	if filter == "" {
		return configs
	}
	keep := map[string]bool{}
	for _, c := range configs {
		for _, w := range strings.Split(filter, ";") {
			if matchRow(c.Name, strings.TrimSpace(w)) {
				keep[c.Name] = true
				keep[baseOf(c)] = true
			}
		}
	}
	return slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return !keep[c.Name] })
}

// matchRow: w is a filter word (a row name holds it) or "=" and a whole row
// name (the row alone; its name's commas are part of it, so such words are
// separated by ";").
func matchRow(name, w string) bool {
	if exact, ok := strings.CutPrefix(w, "="); ok {
		return name == exact || name == exact+baselineSuffix
	}
	if w == "" {
		return false
	}
	for _, part := range strings.Split(w, ",") {
		if part = strings.TrimSpace(part); part != "" && strings.Contains(name, part) {
			return true
		}
	}
	return false
}

// workloadRows are the rows a run measures before skips: the --configs
// filter applied to the rows of the mode.
func workloadRows(baseline bool, filter string, short bool) []wlConfig {
	return pick(modeRows(rowConfigs(baseline), short), filter)
}
