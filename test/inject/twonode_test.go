//go:build linux

package inject

import (
	"fmt"
	"testing"
)

// joins measures how the model and resources servers' spans join the
// agent's calls, through parent links in the spans the sink received.
type joins struct {
	runs         int // the agent's /run SERVER spans (one per rollout)
	remoteServer int // SERVER spans of model/resources
	joined       int // ... whose parent is an agent CLIENT span of the same trace
	underRun     int // ... whose ancestors reach an agent /run SERVER span
	complete     int // /run spans with all 7 model/resources SERVER spans of a rollout below them
	underJob     int // /run spans whose ancestors reach the collector's gym.job
}

func measure(r result) joins {
	byID := map[string]sinkSpan{}
	for _, s := range r.spans {
		byID[s.TraceID+s.SpanID] = s
	}
	// ancestor walks up to 64 parents within the trace.
	ancestor := func(s sinkSpan, match func(sinkSpan) bool) (sinkSpan, bool) {
		for i := 0; i < 64 && s.Parent != ""; i++ {
			p, ok := byID[s.TraceID+s.Parent]
			if !ok {
				return sinkSpan{}, false
			}
			if match(p) {
				return p, true
			}
			s = p
		}
		return sinkSpan{}, false
	}
	isRun := func(s sinkSpan) bool {
		return s.Kind == "SERVER" && s.pid() == r.pids["agent"] && s.Name == "POST /run"
	}
	var j joins
	perRun := map[string]int{}
	for _, s := range r.spans {
		if isRun(s) {
			j.runs++
			if _, ok := ancestor(s, func(p sinkSpan) bool { return p.Name == "gym.job" && p.pid() == r.pids["collector"] }); ok {
				j.underJob++
			}
		}
		if s.Kind != "SERVER" || (s.pid() != r.pids["model"] && s.pid() != r.pids["resources"]) {
			continue
		}
		j.remoteServer++
		if p, ok := byID[s.TraceID+s.Parent]; ok && p.Kind == "CLIENT" && p.pid() == r.pids["agent"] {
			j.joined++
		}
		if run, ok := ancestor(s, isRun); ok {
			j.underRun++
			perRun[run.SpanID]++
		}
	}
	for _, n := range perRun {
		if n == 7 {
			j.complete++
		}
	}
	return j
}

func metric(m map[string]float64, name string) float64 {
	return m[`gymtrace_kernel_events_total{reason="`+name+`"}`]
}

// TestTwoNodes: agent + collector on one "node", model + resources on the
// other, one gymtrace each, one OTLP receiver: the model's and resources'
// spans must hang under the agent's calls exactly as when one gymtrace sees
// the whole stack on one node. With injection off, they must not (Gym's
// "disconnected traces").
func TestTwoNodes(t *testing.T) {
	needStack(t)
	a, b := nodes(t)

	two := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true})
	jt := measure(two)
	t.Logf("two nodes, injection on: %+v", jt)
	for i, m := range two.metrics {
		t.Logf("  gymtrace %d: sockets=%v prepared=%v injected=%v miss=%v not_pushed=%v push_fail=%v unattributed=%v",
			i, metric(m, "inject_sockets"), metric(m, "inject_prepared"), metric(m, "inject_injected"),
			metric(m, "inject_miss"), metric(m, "inject_not_pushed"), metric(m, "inject_push_fail"), metric(m, "inject_unattributed"))
	}

	one := runStack(t, topology{agentNS: a, modelNS: a, agentIP: "192.0.2.1", modelIP: "192.0.2.1", oneTracer: true, inject: true})
	jo := measure(one)
	t.Logf("one node, one gymtrace:  %+v", jo)

	off := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: false})
	jf := measure(off)
	t.Logf("two nodes, injection off: %+v", jf)

	// The agent's /run arrives without traceparent: the kernel starts its
	// trace in the syscall that completes the request, before the handler
	// runs (gt_inject_root), although the fresh agent owns no injectable
	// socket yet: its handler opens the first. (When userspace published
	// it, after reading the record, the first wave's calls raced that:
	// 56 of 84 joined, inject_miss 32, in a CI run beside QEMU guests.)
	bare := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true, untracedClient: true})
	jb := measure(bare)
	m := bare.metrics[0]
	t.Logf("two nodes, untraced collector: %+v; agent's gymtrace: injected=%v miss=%v", jb, metric(m, "inject_injected"), metric(m, "inject_miss"))
	if jb.remoteServer != 7*rollouts || jb.joined != jb.remoteServer || jb.complete != rollouts || metric(m, "inject_miss") != 0 {
		t.Errorf("untraced collector: %d of %d remote SERVER spans joined, %d of %d rollouts complete, inject_miss %v; want all, all, 0",
			jb.joined, jb.remoteServer, jb.complete, rollouts, metric(m, "inject_miss"))
	}

	if jt.remoteServer != 7*rollouts {
		t.Errorf("two nodes: %d model/resources SERVER spans, want %d", jt.remoteServer, 7*rollouts)
	}
	if jt.joined != jt.remoteServer || jt.underRun != jt.remoteServer || jt.runs != rollouts || jt.complete != rollouts {
		t.Errorf("two nodes: %d of %d remote SERVER spans joined (%d under their /run), %d of %d rollouts complete",
			jt.joined, jt.remoteServer, jt.underRun, jt.complete, jt.runs)
	}
	if jt.joined < jo.joined || jt.complete < jo.complete || jt.underJob < jo.underJob {
		t.Errorf("two nodes join worse than one: %+v vs %+v", jt, jo)
	}
	if jf.joined != 0 {
		t.Errorf("injection off: %d remote SERVER spans joined across nodes; want 0 (disconnected traces)", jf.joined)
	}
	// Two instances side by side: one cgroup attachment each, and neither
	// disturbs the other (the model/resources side makes no outbound call,
	// so only the agent's instance has sockets to inject into).
	if fmt.Sprint(two.sockOps) != "[1 1]" || fmt.Sprint(off.sockOps) != "[0 0]" {
		t.Errorf("own sock_ops programs attached to the cgroup root, per gymtrace: %v injecting (want [1 1]), %v with --inject=false (want [0 0])",
			two.sockOps, off.sockOps)
	}
	for i, m := range two.metrics {
		if metric(m, "inject_push_fail") != 0 || metric(m, "inject_socket_fail") != 0 {
			t.Errorf("gymtrace %d: push_fail=%v socket_fail=%v", i, metric(m, "inject_push_fail"), metric(m, "inject_socket_fail"))
		}
	}
	if metric(two.metrics[0], "inject_sockets") == 0 {
		t.Errorf("the agent's gymtrace put no socket in its sockhash")
	}
	if metric(two.metrics[0], "inject_injected") == 0 {
		t.Errorf("the agent's gymtrace injected nothing")
	}
}

// TestTwoNodesUVloop: the same two nodes on Gym's runtime (uvloop and
// httptools on every server) at concurrency 64: the traceparent the agent's
// gymtrace injects must name the right parent although uvloop flushes the
// agent's writes outside the task that made them (bpf/python_uvloop.h), so
// every rollout is one trace across both gymtraces.
func TestTwoNodesUVloop(t *testing.T) {
	needStack(t)
	a, b := nodes(t)
	const n = 64
	r := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true,
		loop: "uvloop", http: "httptools", n: n, c: 64})
	j := measure(r)
	m := r.metrics[0]
	t.Logf("two nodes, uvloop+httptools, c=64: %+v; agent's gymtrace: injected=%v miss=%v unattributed=%v",
		j, metric(m, "inject_injected"), metric(m, "inject_miss"), metric(m, "inject_unattributed"))
	if j.remoteServer != 7*n {
		t.Errorf("%d model/resources SERVER spans, want %d", j.remoteServer, 7*n)
	}
	if j.joined != j.remoteServer || j.underRun != j.remoteServer || j.runs != n || j.complete != n {
		t.Errorf("%d of %d remote SERVER spans joined (%d under their /run), %d of %d rollouts complete",
			j.joined, j.remoteServer, j.underRun, j.complete, j.runs)
	}
}
