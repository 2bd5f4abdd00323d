//go:build linux

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPureServerProbes: a server that only answers loses its Python probes
// once it has answered 32 requests without a call of its own (the model and
// resources servers here); the agent, which calls out for every request it
// answers, keeps them. When the resources server starts calling out (a
// sandbox CLI per tool call) its probes come back, and from then on every
// CLI it runs has its own request as parent at concurrency 4, which only the
// asyncio context decides (without it the parent is "ambiguous").
func TestPureServerProbes(t *testing.T) {
	st := lcStack(t)
	res, model, agent := st.server("resources"), st.server("model"), st.server("agent")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	g := lcGymtrace(t, "all", out, lcPids(st)...)
	off := func(pid int) string {
		return fmt.Sprintf(`msg="python probes off: the process only serves" pid=%d `, pid)
	}
	back := func(pid int) string {
		return fmt.Sprintf(`msg="python probes back: the process calls out" pid=%d `, pid)
	}

	// No sandbox: the resources and model servers only answer. Load until
	// both have said so (32 answers each, then a second of grace).
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(g.Stderr.String(), off(res.PID)) || !strings.Contains(g.Stderr.String(), off(model.PID)) {
		if time.Now().After(deadline) {
			t.Fatalf("the resources (%d) and model (%d) servers' probes are still on after 60 s of load; gymtrace:\n%s",
				res.PID, model.PID, tail(g.Stderr.String(), 4096))
		}
		lcCollect(t, st, 4, "--concurrency", "4")
	}
	if strings.Contains(g.Stderr.String(), off(agent.PID)) {
		t.Fatalf("the agent (%d), which calls out, lost its probes", agent.PID)
	}

	// The resources server calls out now: its probes come back (the first
	// CLIs, racing them, may stay unattributed).
	lcCollect(t, st, 4, "--concurrency", "4", "--sandbox", "docker")
	g.WaitOutput(t, true, back(res.PID), 20*time.Second)
	if strings.Contains(g.Stderr.String(), back(model.PID)) {
		t.Errorf("the model server (%d) got its probes back without calling out", model.PID)
	}
	// Probes attach in the background after that line: give them time.
	time.Sleep(time.Second)
	t0 := uint64(time.Now().UnixNano())

	const n, turns = 8, 2
	lcCollect(t, st, n, "--concurrency", "4", "--sandbox", "docker", "--turns", fmt.Sprint(turns))
	g.shutdown(t) // exports everything
	all := readSpans(t, out)
	s := newSpanSet(all)
	var cli, good int
	for _, sp := range all {
		if !strings.HasPrefix(sp.Name, "gym.sandbox.") || sp.Start < t0 {
			continue
		}
		cli++
		parent, ok := s.parent(sp)
		if ok && parent.Name == "POST /run_sandbox" && parent.PID() == res.PID &&
			sp.Attr("nemo.gym.rollout.id") != "" && sp.Attr("nemo.gym.rollout.id") == parent.Attr("nemo.gym.rollout.id") {
			good++
			continue
		}
		t.Errorf("%s: parent %v (found %v, unresolved %q), want its POST /run_sandbox", sp, parent, ok,
			sp.Attr("gymtrace.parent.unresolved"))
	}
	if want := n * (1 + turns); cli < want {
		t.Errorf("%d sandbox spans after the probes came back, want at least %d", cli, want)
	}
	t.Logf("after the probes came back: %d of %d sandbox spans under their request", good, cli)
}
