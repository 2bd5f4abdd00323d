//go:build linux

package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestRolesByBehaviour: the stack runs without Gym's environment (flags only,
// entry points that name no server type), the collector is a plain
// `python3 collector.py`, and every process is given to gymtrace as a bare
// --pid with no =ROLE. Only traffic tells the roles (docs/roles.md):
//
//   - the collector sends POST /run: the orchestrator, with its gym.job and
//     service.name nemo-gym/orchestrator on every span;
//   - the model serves only /v1/responses, half of them under /ng-rollout/<id>,
//     to the agent: a model server, every request named POST /v1/responses
//     with its gym.model.responses, from the first one on;
//   - resources: /seed_session, as before.
func TestRolesByBehaviour(t *testing.T) {
	st := startStack(t, t, "--no-gym-env")
	const n = 12
	cmd, stdout, stderr, pid := lcHeldCollector(t, []string{python, filepath.Join(repoRoot, "test", "stack", "collector.py"),
		"--agent-url", st.server("agent").URL,
		"--rollouts", strconv.Itoa(n), "--concurrency", "4", "--prefix", "mixed", "--model-route", "responses"})
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default,model_call", out, append(lcPids(st), strconv.Itoa(pid))...)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lcWait(t, cmd, stdout, stderr, n)
	lcAwait(t, g, "the collector's gym.job", lcBuilt("job", 1))
	m := g.settle(t, 1)
	g.shutdown(t)
	s := lcRead(t, out, append(st.pids(), pid)...)
	t.Cleanup(func() {
		if t.Failed() {
			s.dump(t)
		}
	})

	// The orchestrator.
	lcCheckJob(t, s, st, pid, n, false)
	for _, sp := range s.filter(func(sp Span) bool { return sp.PID() == pid }) {
		if sp.Res("service.name") != "nemo-gym/orchestrator" || sp.Res("nemo.gym.server.type") != "orchestrator" {
			t.Errorf("collector span %s: service %q, type %q; want nemo-gym/orchestrator, orchestrator",
				sp, sp.Res("service.name"), sp.Res("nemo.gym.server.type"))
		}
	}

	// The model server.
	model, agent := st.server("model"), st.server("agent")
	calls := s.filter(func(sp Span) bool {
		return sp.PID() == agent.PID && sp.Kind == "CLIENT" && sp.AttrInt("server.port") == model.Port
	})
	names := map[string]int{}
	prefixed := 0
	for _, sp := range s.filter(func(sp Span) bool { return sp.PID() == model.PID }) {
		names[sp.Name]++
		if sp.Kind == "SERVER" && strings.HasPrefix(sp.Path(), "/ng-rollout/") {
			prefixed++
		}
		if sp.Res("nemo.gym.server.type") != "responses_api_models" {
			t.Errorf("model span %s: type %q, want responses_api_models", sp, sp.Res("nemo.gym.server.type"))
		}
	}
	if len(calls) == 0 || names["POST /v1/responses"] != len(calls) || names["gym.model.responses"] != len(calls) || len(names) != 2 {
		t.Errorf("model spans %v; want %d POST /v1/responses and %d gym.model.responses (the agent's calls), nothing else",
			names, len(calls), len(calls))
	}
	if prefixed == 0 || prefixed == len(calls) {
		t.Errorf("%d of %d model requests had the /ng-rollout prefix; the test needs both kinds", prefixed, len(calls))
	}
	for _, gs := range lcNamed(s, "gym.model.responses") {
		if p, ok := s.parent(gs); !ok || p.Name != "POST /v1/responses" || p.PID() != model.PID {
			t.Errorf("%s is not under the model's server span", gs)
		}
	}

	// Resources: their routes are named without the prefix.
	res := st.server("resources")
	for _, sp := range s.filter(func(sp Span) bool { return sp.PID() == res.PID && sp.Kind == "SERVER" }) {
		if strings.Contains(sp.Name, "ng-rollout") || sp.Res("nemo.gym.server.type") != "resources_servers" {
			t.Errorf("resources span %s (type %q): want the route without the prefix, type resources_servers",
				sp, sp.Res("nemo.gym.server.type"))
		}
	}
	if v := m[`gymtrace_role_undecided_spans_total`]; v != 0 {
		t.Errorf("gymtrace_role_undecided_spans_total = %v, want 0", v)
	}
	t.Logf("%d rollouts; model: %v (%d with the prefix); roles inferred: %v, spans held: %v",
		n, names, prefixed, m[`gymtrace_roles_inferred_total`], m[`gymtrace_role_held_spans_total`])
}

// TestRolesAttachMidRun: gymtrace attaches, with bare pids, while a
// collection is already running: the agent's /run requests in flight were
// never seen, so its first calls to the model come from a process not yet
// known as an agent. The model's spans wait for its role and are then named
// like every later one: one name for its server spans, each with its
// gym.model.responses (the run named the same route two ways, 37
// and 219 times).
func TestRolesAttachMidRun(t *testing.T) {
	st := startStack(t, t, "--no-gym-env")
	const n = 1200
	argv := []string{python, filepath.Join(repoRoot, "test", "stack", "collector.py"), "--agent-url", st.server("agent").URL,
		"--rollouts", strconv.Itoa(n), "--concurrency", "4", "--prefix", "mixed", "--model-route", "responses"}
	cmd, stdout, stderr := lcCommand(argv)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the collector: %v", err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default,model_call", out, lcPids(st)...)
	lcWait(t, cmd, stdout, stderr, n)
	m := g.settle(t, 1)
	g.shutdown(t)
	s := lcRead(t, out, st.pids()...)
	model := st.server("model")
	names := map[string]int{}
	for _, sp := range s.filter(func(sp Span) bool { return sp.PID() == model.PID }) {
		names[sp.Name]++
		if sp.Res("nemo.gym.server.type") != "responses_api_models" {
			t.Errorf("model span %s: type %q, want responses_api_models", sp, sp.Res("nemo.gym.server.type"))
		}
	}
	srv := names["POST /v1/responses"]
	if srv == 0 || names["gym.model.responses"] != srv || len(names) != 2 {
		t.Errorf("model spans %v; want one server-span name, POST /v1/responses, each with its gym.model.responses", names)
	}
	if v := m[`gymtrace_role_undecided_spans_total`]; v != 0 {
		t.Errorf("gymtrace_role_undecided_spans_total = %v, want 0", v)
	}
	t.Logf("attached mid-run: model %v; roles inferred %v, spans held %v",
		names, m[`gymtrace_roles_inferred_total`], m[`gymtrace_role_held_spans_total`])
}
