//go:build linux

package inject

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// conns measures the model's and resources' inbound connections, each
// told by its server and client address in the SERVER spans: how many
// there were, whether the first request of each carried the traceparent
// (its span joined to an agent CLIENT span), and how many served more than
// one rollout (none may, when every rollout connects anew).
type conns struct {
	total       int // connections to model/resources
	firstJoined int // ... whose first request's SERVER span is joined to an agent CLIENT span
	shared      int // ... that served requests of more than one rollout
}

func measureConns(r result) conns {
	byID := map[string]sinkSpan{}
	for _, s := range r.spans {
		byID[s.TraceID+s.SpanID] = s
	}
	// The /run a span is under (its rollout), "" when none.
	runOf := func(s sinkSpan) string {
		for i := 0; i < 64 && s.Parent != ""; i++ {
			p, ok := byID[s.TraceID+s.Parent]
			if !ok {
				return ""
			}
			if p.Kind == "SERVER" && p.pid() == r.pids["agent"] && p.Name == "POST /run" {
				return p.TraceID + p.SpanID
			}
			s = p
		}
		return ""
	}
	type conn struct {
		first    sinkSpan
		rollouts map[string]bool
	}
	byConn := map[string]*conn{}
	for _, s := range r.spans {
		if s.Kind != "SERVER" || (s.pid() != r.pids["model"] && s.pid() != r.pids["resources"]) {
			continue
		}
		key := fmt.Sprintf("%d %v:%v", s.pid(), s.Attrs["client.address"], s.Attrs["client.port"])
		c := byConn[key]
		if c == nil {
			c = &conn{first: s, rollouts: map[string]bool{}}
			byConn[key] = c
		}
		if s.Start < c.first.Start {
			c.first = s
		}
		c.rollouts[runOf(s)] = true
	}
	var m conns
	for _, c := range byConn {
		m.total++
		if p, ok := byID[c.first.TraceID+c.first.Parent]; ok && p.Kind == "CLIENT" && p.pid() == r.pids["agent"] {
			m.firstJoined++
		}
		if len(c.rollouts) > 1 {
			m.shared++
		}
	}
	return m
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestTwoNodesNewConnections: the two nodes on Gym's runtime (uvloop and
// httptools) with the agent opening new connections for every rollout (a
// connection pool per rollout, closed at its end), so every inter-server
// request is on a connection the agent's gymtrace first saw at connect():
// every model/resources SERVER span, the first request of each connection
// included, hangs under the exported agent CLIENT span its traceparent
// names, and every rollout is one whole trace across both gymtraces.
// scripts/kernel-matrix-guest runs it in the guests of kernels where
// injection is on (GYMTRACE_TEST_INJECT_ON=1: not forced, and it must be
// on), with GYMTRACE_TWONODE_N and _C rollouts and concurrency (16 and 8
// by default) and GYMTRACE_TWONODE_OUT naming a file for its counts, which
// TestKernelMatrix asserts again per kernel.
func TestTwoNodesNewConnections(t *testing.T) {
	needStack(t)
	a, b := nodes(t)
	n, c := envInt("GYMTRACE_TWONODE_N", 16), envInt("GYMTRACE_TWONODE_C", 8)
	r := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true,
		loop: "uvloop", http: "httptools", n: n, c: c, connections: "per-rollout"})
	j := measure(r)
	cn := measureConns(r)
	var enabled []string
	for _, m := range r.metrics {
		enabled = append(enabled, injectState(m))
	}
	m := r.metrics[0]
	sum := map[string]any{
		"rollouts": n, "concurrency": c, "runs": j.runs, "under_job": j.underJob,
		"remote_server": j.remoteServer, "joined": j.joined, "under_run": j.underRun, "complete": j.complete,
		"connections": cn.total, "first_joined": cn.firstJoined, "connections_shared": cn.shared,
		"injected": metric(m, "inject_injected"), "sockets": metric(m, "inject_sockets"),
		"miss": metric(m, "inject_miss"), "not_pushed": metric(m, "inject_not_pushed"),
		"unattributed":   metric(m, "inject_unattributed"),
		"inject_enabled": enabled, "forced": !injectDecided(),
		"push_fail": metric(m, "inject_push_fail") + metric(r.metrics[1], "inject_push_fail"),
	}
	js, _ := json.Marshal(sum)
	// scripts/kernel-matrix-guest and TestKernelMatrix read this line.
	t.Logf("twonode: %s", js)
	if dir := os.Getenv("GYMTRACE_TWONODE_KEEP"); dir != "" {
		keep(t, dir, r)
	}
	if out := os.Getenv("GYMTRACE_TWONODE_OUT"); out != "" {
		if err := os.WriteFile(out, append(js, '\n'), 0o644); err != nil {
			t.Error(err)
		}
	}

	if j.remoteServer != 7*n {
		t.Errorf("%d model/resources SERVER spans, want %d", j.remoteServer, 7*n)
	}
	// Every remote request joined to its agent CLIENT span, except where
	// the agent's gymtrace counted a call it could not attribute
	// (inject_unattributed: a handler bound to no request, e.g. by a lost
	// record; a head split by injection is bound since c0474b4, and
	// TestKernelMatrix holds the guests to 100 %). Such a call goes without
	// a header, never with a wrong one, so
	// each miss here is one counted there (and the calls under it lose
	// their chain to /run, so that count is held only when none is); a join
	// to a wrong span would show as a connection serving two rollouts.
	un := int(metric(m, "inject_unattributed"))
	if j.runs != n || j.joined+un < j.remoteServer || (un == 0 && j.underRun != j.remoteServer) || j.complete+un < n {
		t.Errorf("%d of %d remote SERVER spans joined to an agent CLIENT span (%d under their /run); %d of %d rollouts complete; "+
			"%d calls counted unattributed", j.joined, j.remoteServer, j.underRun, j.complete, j.runs, un)
	}
	if j.joined != j.remoteServer {
		t.Logf("not whole: %d of %d remote SERVER spans joined, %d of %d rollouts complete, %d calls unattributed (each miss counted; TestKernelMatrix holds the guests to 100 %%)",
			j.joined, j.remoteServer, j.complete, n, un)
	}
	// New connections per rollout: each rollout has at least one of its own
	// to the model and one to the resources server, and none serves two.
	if cn.total < 2*n || cn.shared != 0 || cn.firstJoined+un < cn.total {
		t.Errorf("%d connections to model/resources (want at least %d, one each per rollout), %d serving more than one rollout (want 0), "+
			"%d whose first request is joined to its agent CLIENT span", cn.total, 2*n, cn.shared, cn.firstJoined)
	}
	if metric(m, "inject_push_fail") != 0 || metric(m, "inject_socket_fail") != 0 || metric(m, "inject_injected") < float64(7*n) {
		t.Errorf("the agent's gymtrace: injected=%v (want at least %d) push_fail=%v socket_fail=%v",
			metric(m, "inject_injected"), 7*n, metric(m, "inject_push_fail"), metric(m, "inject_socket_fail"))
	}
	if injectDecided() {
		for i, st := range enabled {
			if st != `inject_enabled{reason=""} 1` {
				t.Errorf("gymtrace %d: %s; GYMTRACE_TEST_INJECT_ON=1 wants injection on as gymtrace decides it", i, st)
			}
		}
	}
	if slices.Contains(enabled, "") {
		t.Errorf("a gymtrace without gymtrace_inject_enabled: %v", enabled)
	}
}

// injectState is gymtrace_inject_enabled as scraped ("" when missing).
func injectState(m map[string]float64) string {
	for k, v := range m {
		if strings.HasPrefix(k, "gymtrace_inject_enabled{") {
			return fmt.Sprintf("%s %.0f", strings.TrimPrefix(k, "gymtrace_"), v)
		}
	}
	return ""
}

// keep copies what the sink received, every process's output and each
// gymtrace's metrics into dir, to read a failure from afterwards.
func keep(t *testing.T, dir string, r result) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Error(err)
		}
	}
	if b, err := os.ReadFile(r.sinkFile); err == nil {
		write("spans.jsonl", b)
	}
	for name, out := range r.logs {
		write(name+".log", []byte(out))
	}
	for i, m := range r.metrics {
		var lines []string
		for k, v := range m {
			lines = append(lines, fmt.Sprintf("%s %v", k, v))
		}
		slices.Sort(lines)
		write(fmt.Sprintf("metrics-gymtrace-%d.txt", i), []byte(strings.Join(lines, "\n")+"\n"))
	}
	pids, _ := json.Marshal(r.pids)
	write("pids.json", pids)
}
