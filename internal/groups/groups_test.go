package groups

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestBitsAreStable(t *testing.T) {
	// The kernel reads these numbers; changing one silently mis-gates.
	want := map[string]Group{
		"job": 0, "server": 1, "http_client": 2, "rollout": 3, "agent": 4, "model_call": 5,
		"verify": 6, "sandbox": 7, "checkpoint": 8, "step": 9, "optimizer": 10, "startup": 11,
	}
	if len(want) != Count {
		t.Fatalf("Count = %d, want %d", Count, len(want))
	}
	for name, bit := range want {
		g, ok := ByName(name)
		if !ok || g != bit {
			t.Errorf("ByName(%q) = %d, %v; want %d", name, g, ok, bit)
		}
		if g.Name() != name {
			t.Errorf("Group(%d).Name() = %q, want %q", bit, g.Name(), name)
		}
	}
	for i, in := range All() {
		if int(in.Group) != i {
			t.Errorf("table[%d] holds group %d", i, in.Group)
		}
	}
}

func TestTableMatchesSpec(t *testing.T) {
	spans := map[string][]string{
		"job":         {"gym.job"},
		"server":      {"GET /...", "POST /..."},
		"http_client": {"HTTP POST", "HTTP GET"},
		"rollout":     {"gym.rollout"},
		"agent":       {"gym.agent.responses"},
		"model_call":  {"gym.model.chat_completions", "gym.model.responses", "gym.model.messages"},
		"verify":      {"gym.verify"},
		"sandbox":     {"gym.sandbox.start", "gym.sandbox.exec"},
		"checkpoint":  nil, "step": nil, "optimizer": nil,
		"startup": {"gym.startup", "gym.startup.server", "gym.server.startup", "gym.server.startup.<stage>"},
	}
	for _, in := range All() {
		if !reflect.DeepEqual(in.Spans, spans[in.Name]) {
			t.Errorf("%s spans = %q, want %q", in.Name, in.Spans, spans[in.Name])
		}
		if in.EmittedBy == "" {
			t.Errorf("%s has no emitter", in.Name)
		}
		if in.Inherited != (in.Spans == nil) {
			t.Errorf("%s: Inherited = %v with spans %q", in.Name, in.Inherited, in.Spans)
		}
	}
	// Callers get copies: mutating one must not change the table.
	a := All()
	a[0].Spans[0] = "mutated"
	if in, _ := Lookup(Job); in.Spans[0] != "gym.job" {
		t.Errorf("All() exposed the table")
	}
}

func names(t *testing.T, spec string) []string {
	t.Helper()
	m, err := Resolve(spec)
	if err != nil {
		t.Fatalf("Resolve(%q): %v", spec, err)
	}
	return m.Names()
}

func TestResolvePresets(t *testing.T) {
	cases := map[string][]string{
		"default":     {"http_client", "job", "rollout", "server"},
		"per_rollout": {"agent", "http_client", "model_call", "rollout", "server", "verify"},
		"all": {"agent", "checkpoint", "http_client", "job", "model_call", "optimizer", "rollout",
			"sandbox", "server", "startup", "step", "verify"},
		"startup": {"startup"},
	}
	for spec, want := range cases {
		if got := names(t, spec); !reflect.DeepEqual(got, want) {
			t.Errorf("Resolve(%q) = %q, want %q", spec, got, want)
		}
	}
	if DefaultSpec != "default" {
		t.Errorf("DefaultSpec = %q", DefaultSpec)
	}
	// per_rollout omits job on purpose; every preset keeps both join halves.
	if PerRolloutMask.Has(Job) {
		t.Error("per_rollout must not include job")
	}
	// The presets are Gym's span-groups page's: startup (Gym's newer code,
	// in its newer default) is reached by name or through all only.
	if DefaultMask.Has(Startup) || PerRolloutMask.Has(Startup) || !AllMask.Has(Startup) {
		t.Error("startup must be in all and in no other preset")
	}
	for _, p := range Presets() {
		if !p.Mask.Has(Server) || !p.Mask.Has(HTTPClient) {
			t.Errorf("preset %s lacks a join half", p.Name)
		}
		if p.UseWhen == "" {
			t.Errorf("preset %s has no use-when text", p.Name)
		}
	}
}

func TestResolveRules(t *testing.T) {
	cases := []struct {
		spec string
		want []string
	}{
		{"Default, sandbox", []string{"http_client", "job", "rollout", "sandbox", "server"}},
		{"server,http_client,verify", []string{"http_client", "server", "verify"}},
		{"  VERIFY  ", []string{"verify"}},         // case and whitespace
		{"verify,,  ,verify,", []string{"verify"}}, // empty parts skipped, duplicates union
		{"per_rollout,default", []string{"agent", "http_client", "job", "model_call", "rollout", "server", "verify"}},
		{"", []string{}},    // empty spec: no groups
		{" , ", []string{}}, // only empty parts: no groups
		{"step,CHECKPOINT,optimizer", []string{"checkpoint", "optimizer", "step"}}, // inherited groups resolve
	}
	for _, c := range cases {
		if got := names(t, c.spec); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Resolve(%q) = %q, want %q", c.spec, got, c.want)
		}
	}
	if m, _ := Resolve(""); m != 0 {
		t.Errorf("Resolve(\"\") = %#x, want 0", m)
	}
}

func TestResolveUnknown(t *testing.T) {
	for spec, bad := range map[string]string{
		"defualt":             "defualt",
		"default, Sandbx":     "sandbx",
		"server,tool_call":    "tool_call", // Gym deliberately has no tool_call group
		"dataset":             "dataset",
		"server;http_client":  "server;http_client",
		"all,  Nope  ,server": "nope",
	} {
		m, err := Resolve(spec)
		if err == nil {
			t.Errorf("Resolve(%q) = %v, want an error", spec, m)
			continue
		}
		var ue *UnknownError
		if !errors.As(err, &ue) || ue.Part != bad {
			t.Errorf("Resolve(%q) error %v: want part %q", spec, err, bad)
		}
		want := `unknown span group or preset "` + bad + `"; valid options: agent, all, checkpoint, default, ` +
			`http_client, job, model_call, optimizer, per_rollout, rollout, sandbox, server, startup, step, verify`
		if err.Error() != want {
			t.Errorf("Resolve(%q) error\n got %s\nwant %s", spec, err, want)
		}
	}
}

func TestMaskMethods(t *testing.T) {
	m := MaskOf(Server, Verify)
	if !m.Has(Server) || !m.Has(Verify) || m.Has(Job) || m.Len() != 2 {
		t.Errorf("MaskOf: %v", m.Names())
	}
	if got := m.With(Job).Without(Server).String(); got != "job,verify" {
		t.Errorf("With/Without/String = %q", got)
	}
	if !m.Any(Verify.Mask()) || m.Any(Job.Mask()) {
		t.Error("Any")
	}
	if !reflect.DeepEqual(m.Groups(), []Group{Server, Verify}) {
		t.Errorf("Groups = %v", m.Groups())
	}
	if AllGroups != 1<<12-1 {
		t.Errorf("AllGroups = %#x", AllGroups)
	}
	// String round-trips through Resolve.
	for _, p := range Presets() {
		back, err := Resolve(p.Mask.String())
		if err != nil || back != p.Mask {
			t.Errorf("round trip of %s: %v %v", p.Name, back, err)
		}
	}
	if Group(200).Name() != "group(200)" {
		t.Error("out-of-range name")
	}
}

func TestJoinWarning(t *testing.T) {
	for spec, want := range map[string]string{
		"default":            "",
		"per_rollout":        "",
		"all":                "",
		"server,verify":      "without http_client:",
		"http_client,verify": "without server:",
		"verify":             "without server and http_client:",
		"":                   "without server and http_client:",
	} {
		m, _ := Resolve(spec)
		got := JoinWarning(m)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("JoinWarning(%q) = %q, want containing %q", spec, got, want)
		}
		if got != "" && (!strings.Contains(got, "traces will not join across processes") || strings.Contains(got, "\n")) {
			t.Errorf("JoinWarning(%q) = %q: want one line naming the consequence", spec, got)
		}
	}
}

// TestHeaderIsCurrent fails when bpf/common/groups.h differs from what the
// generator writes: run `go generate ./internal/groups` and rebuild the BPF
// objects.
func TestHeaderIsCurrent(t *testing.T) {
	have, err := os.ReadFile(filepath.Join("..", "..", HeaderPath))
	if err != nil {
		t.Fatalf("reading the committed header: %v", err)
	}
	if want := CHeader(); string(have) != string(want) {
		t.Fatalf("%s is stale; run `go generate ./internal/groups`.\n--- committed\n%s\n--- generated\n%s", HeaderPath, have, want)
	}
}

func TestHeaderContent(t *testing.T) {
	h := string(CHeader())
	for _, line := range []string{
		"#define GT_GROUP_JOB (1ULL << 0)",
		"#define GT_GROUP_HTTP_CLIENT (1ULL << 2)",
		"#define GT_GROUP_MODEL_CALL (1ULL << 5)",
		"#define GT_GROUP_OPTIMIZER (1ULL << 10)",
		"#define GT_GROUP_STARTUP (1ULL << 11)",
		"#define GT_GROUP_COUNT 12",
		"#pragma once",
	} {
		if !strings.Contains(h, line+"\n") {
			t.Errorf("header lacks %q", line)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"model_call", "gym.model.messages", "per_rollout", "GROUP", "PRESET", "optimizer", "every group, including sandbox and startup", "startup to its default preset"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
