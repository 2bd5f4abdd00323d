//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --- sandbox ------------------------------------------------------------------

// TestLifecycleSandboxSpans: a resources server's tool route runs each
// provider's CLI (start once per rollout, exec every turn, with return code
// 3), and /verify runs an enroot exec. Every CLI must give one span with the
// right name, provider, return code and parent, and nothing of its command
// line.
func TestLifecycleSandboxSpans(t *testing.T) {
	st := lcStack(t)
	res := st.server("resources")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "all", out, lcPids(st)...)

	const n, turns = 2, 2
	for _, p := range lcProviders {
		lcCollect(t, st, n, "--sandbox", p, "--sandbox-rc", "3", "--verify-sandbox", "enroot", "--turns", strconv.Itoa(turns))
	}
	perProvider := n * (1 + turns)
	wantCLIs := len(lcProviders) * (perProvider + n) // + one verify exec per rollout
	lcAwait(t, g, "every sandbox span", lcBuilt("sandbox", float64(wantCLIs)))
	m := g.metrics(t)
	if got := groupCounters(m, "gymtrace_events_emitted_total")["sandbox"]; got != float64(wantCLIs) {
		t.Errorf("gymtrace_events_emitted_total{group=\"sandbox\"} = %v, want %d (one per CLI)", got, wantCLIs)
	}
	g.shutdown(t)
	s := lcRead(t, out, st.pids()...)

	starts, execs := lcNamed(s, "gym.sandbox.start"), lcNamed(s, "gym.sandbox.exec")
	if len(starts) != len(lcProviders)*n || len(execs) != len(lcProviders)*(turns*n+n) {
		t.Fatalf("%d gym.sandbox.start and %d gym.sandbox.exec spans, want %d and %d",
			len(starts), len(execs), len(lcProviders)*n, len(lcProviders)*(turns*n+n))
	}
	type key struct{ name, provider, via string }
	count := map[key]int{}
	for _, sp := range append(starts, execs...) {
		provider := sp.Attr("nemo.gym.sandbox.provider")
		if sp.Kind != "INTERNAL" || sp.PID() != res.PID || sp.Res("service.name") != "nemo-gym/"+res.Name ||
			sp.Attr("nemo.gym.server.name") != res.Name {
			t.Errorf("%s: kind %s, resource pid %d service %q, server name %q; want INTERNAL in %s (pid %d)",
				sp, sp.Kind, sp.PID(), sp.Res("service.name"), sp.Attr("nemo.gym.server.name"), res.Name, res.PID)
		}
		if sp.Status.Code != "UNSET" {
			t.Errorf("%s: status %v, want unset", sp, sp.Status)
		}
		if sp.Attr("nemo.span.truncated") != "" {
			t.Errorf("%s: truncated", sp)
		}
		for k, v := range sp.Attributes {
			if s := fmt.Sprint(v); strings.Contains(s, "exit ") || strings.Contains(s, "sh -c") ||
				strings.Contains(s, "gt-") || strings.Contains(s, "instance://") || strings.Contains(s, ".sif") {
				t.Errorf("%s: attribute %s=%q leaks the command line", sp, k, s)
			}
		}
		if sp.Duration() < 30*time.Millisecond {
			t.Errorf("%s lasts %v, less than the fake CLI's 30 ms sleep", sp, sp.Duration())
		}
		rc, hasRC := sp.Attributes["nemo.gym.sandbox.return_code"]
		if sp.Name == "gym.sandbox.start" && hasRC {
			t.Errorf("%s: a start has a return code", sp)
		}
		parent, ok := s.parent(sp)
		switch {
		case ok && parent.Name == "POST /run_sandbox" && parent.PID() == res.PID:
			lcWithin(t, sp, parent)
			if sp.TraceID != parent.TraceID || sp.Attr("nemo.gym.rollout.id") == "" ||
				sp.Attr("nemo.gym.rollout.id") != parent.Attr("nemo.gym.rollout.id") {
				t.Errorf("%s: trace/rollout %s/%q, parent's %s/%q", sp, sp.TraceID, sp.Attr("nemo.gym.rollout.id"),
					parent.TraceID, parent.Attr("nemo.gym.rollout.id"))
			}
			if sp.Name == "gym.sandbox.exec" && anyInt(rc) != 3 {
				t.Errorf("%s: return code %v, want 3 (the tool's `exit 3`)", sp, rc)
			}
			count[key{sp.Name, provider, "tool"}]++
		case ok && parent.Name == "gym.verify" && parent.PID() == res.PID:
			lcWithin(t, sp, parent)
			if sp.Name != "gym.sandbox.exec" || anyInt(rc) != 0 || !hasRC {
				t.Errorf("%s under gym.verify: want an exec with return code 0, got rc %v", sp, rc)
			}
			count[key{sp.Name, provider, "verify"}]++
		case !ok && sp.Parent == "" && sp.Attr("gymtrace.parent.unresolved") == "ambiguous":
			// /verify and /get_weather run concurrently (asyncio.gather): without
			// the asyncio context the spawning request is not guessed.
			count[key{sp.Name, provider, "verify"}]++
		default:
			t.Errorf("%s: parent %v (found %v), want its POST /run_sandbox, or gym.verify", sp, parent, ok)
		}
	}
	for _, p := range lcProviders {
		if got := count[key{"gym.sandbox.start", p, "tool"}]; got != n {
			t.Errorf("%s: %d starts from the tool route, want %d", p, got, n)
		}
		if got := count[key{"gym.sandbox.exec", p, "tool"}]; got != turns*n {
			t.Errorf("%s: %d execs from the tool route, want %d", p, got, turns*n)
		}
	}
	if got := count[key{"gym.sandbox.exec", "enroot", "verify"}]; got != len(lcProviders)*n {
		t.Errorf("%d enroot execs from /verify, want %d", got, len(lcProviders)*n)
	}
}

// TestLifecycleSandboxDisabled: with sandbox off the same CLIs give no span,
// and the kernel counts each as discarded (without reading its argv).
func TestLifecycleSandboxDisabled(t *testing.T) {
	st := lcStack(t)
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "default,verify", out, lcPids(st)...)
	const n, turns = 3, 2
	lcCollect(t, st, n, "--sandbox", "docker", "--sandbox-rc", "3", "--verify-sandbox", "apptainer", "--turns", strconv.Itoa(turns))
	want := float64(n * (1 + turns + 1))
	lcAwait(t, g, "the sandbox discard count", func(m map[string]float64) bool {
		return groupCounters(m, "gymtrace_events_discarded_total")["sandbox"] >= want &&
			groupCounters(m, "gymtrace_spans_built_total")["verify"] >= n
	})
	m := g.metrics(t)
	if got := groupCounters(m, "gymtrace_events_discarded_total")["sandbox"]; got != want {
		t.Errorf("gymtrace_events_discarded_total{group=\"sandbox\"} = %v, want %v (one per CLI)", got, want)
	}
	if got := groupCounters(m, "gymtrace_events_emitted_total")["sandbox"]; got != 0 {
		t.Errorf("gymtrace_events_emitted_total{group=\"sandbox\"} = %v with sandbox off", got)
	}
	g.shutdown(t)
	s := lcRead(t, out, st.pids()...)
	if got := s.filter(func(sp Span) bool { return strings.HasPrefix(sp.Name, "gym.sandbox.") }); len(got) != 0 {
		t.Errorf("%d gym.sandbox.* spans with sandbox disabled", len(got))
	}
	if got := len(lcNamed(s, "POST /run_sandbox")); got != n*(1+turns) {
		t.Errorf("%d POST /run_sandbox spans, want %d (the traffic itself is traced)", got, n*(1+turns))
	}
}

// TestLifecycleSandboxUnderDiscovery: the sandbox spans must not depend on how
// the server was found. Known to fail today (see the skip message), so it runs
// only with GYMTRACE_E2E_KNOWN_ISSUES=1.
func TestLifecycleSandboxUnderDiscovery(t *testing.T) {
	if os.Getenv("GYMTRACE_E2E_KNOWN_ISSUES") != "1" {
		t.Skip("known issue: with discovery on, the watcher inspects a server's forked child before it execs the " +
			"sandbox CLI, takes it for a uvicorn worker and calls AddTarget, which overwrites the kernel's " +
			"GT_TARGET_CHILD flag; gt_exec then does not see a sandbox and emits no GT_EV_SANDBOX_START " +
			"(2 of 18 and 8 of 45 CLIs lost in two runs here). Set GYMTRACE_E2E_KNOWN_ISSUES=1 to run it")
	}
	st := lcStack(t)
	res := st.server("resources")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "all", out) // discovery
	const n, turns = 6, 2
	lcCollect(t, st, n, "--sandbox", "docker", "--turns", strconv.Itoa(turns))
	lcAwait(t, g, "the rollouts", lcBuilt("rollout", n))
	time.Sleep(500 * time.Millisecond)
	g.shutdown(t)
	s := lcRead(t, out, res.PID)
	tool := len(lcNamed(s, "POST /run_sandbox"))
	sb := len(s.filter(func(sp Span) bool { return strings.HasPrefix(sp.Name, "gym.sandbox.") }))
	if tool != n*(1+turns) || sb != tool {
		t.Errorf("%d POST /run_sandbox spans and %d gym.sandbox.* spans, want %d of each", tool, sb, n*(1+turns))
	}
}
