//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// --- the scorer's own test -----------------------------------------------------------

// scorerWorld builds truth and spans for rollouts that each do what a small
// agent does: the collector calls /run (agent, pid 10), whose handler calls
// the model (pid 20) twice over one keep-alive connection. The model's
// SERVER span is parented to the agent's CLIENT span, the CLIENT spans to
// /run's gym.rollout span.
type scorerWorld struct {
	recs  []truthRec
	spans []Span
	next  int
}

const (
	swAgent, swModel         = 10, 20
	swAgentPort, swModelPort = 9001, 9002
)

func (w *scorerWorld) id() string {
	w.next++
	return fmt.Sprintf("%016x", w.next)
}

func (w *scorerWorld) span(kind, name, trace, parent string, pid int, start, end int64, attrs map[string]any) Span {
	s := Span{Name: name, Kind: kind, TraceID: trace, SpanID: w.id(), Parent: parent, Start: uint64(start), End: uint64(end),
		Attributes: attrs, Resource: map[string]any{"process.pid": float64(pid)}}
	w.spans = append(w.spans, s)
	return s
}

// rollout adds one rollout starting at t0 (ns); runPeer is the collector's
// local port, modelLocal the agent's local port to the model.
func (w *scorerWorld) rollout(rid string, t0 int64, runPeer, modelLocal int) {
	ms := int64(time.Millisecond)
	trace := fmt.Sprintf("%032x", t0)
	runID := fmt.Sprintf("agent/i-%s", rid)
	w.recs = append(w.recs,
		truthRec{Ev: "out", ID: "coll/o-" + rid, Method: "POST", Path: "/run", Local: truthAddr{"h", runPeer}, Remote: truthAddr{"h", swAgentPort},
			RolloutID: rid, TStart: t0, TEnd: t0 + 100*ms, MonoStart: t0, MonoEnd: t0 + 100*ms, PID: 1},
		truthRec{Ev: "in", ID: runID, Method: "POST", Path: "/run", Local: truthAddr{"h", swAgentPort}, Peer: truthAddr{"h", runPeer},
			RolloutID: rid, TStart: t0 + ms, TEnd: t0 + 99*ms, MonoStart: t0 + ms, MonoEnd: t0 + 99*ms, PID: swAgent})
	srv := w.span("SERVER", "POST /run", trace, "", swAgent, t0+ms/2, t0+99*ms+ms/2,
		map[string]any{"client.port": float64(runPeer), "server.port": float64(swAgentPort)})
	gym := w.span("INTERNAL", "gym.rollout", trace, srv.SpanID, swAgent, t0+ms, t0+99*ms,
		map[string]any{"nemo.gym.rollout.id": rid})
	for k := int64(0); k < 2; k++ {
		a, b := t0+10*ms+40*k*ms, t0+40*ms+40*k*ms
		oid := fmt.Sprintf("agent/o-%s-%d", rid, k)
		w.recs = append(w.recs,
			truthRec{Ev: "out", ID: oid, Cause: runID, Method: "POST", Path: "/v1/responses", Local: truthAddr{"h", modelLocal},
				Remote: truthAddr{"h", swModelPort}, RolloutID: rid, TStart: a, TEnd: b, MonoStart: a, MonoEnd: b, PID: swAgent},
			truthRec{Ev: "in", ID: fmt.Sprintf("model/i-%s-%d", rid, k), Method: "POST", Path: "/v1/responses", Local: truthAddr{"h", swModelPort},
				Peer: truthAddr{"h", modelLocal}, TStart: a + ms, TEnd: b - ms, MonoStart: a + ms, MonoEnd: b - ms, PID: swModel})
		cl := w.span("CLIENT", "HTTP POST", trace, gym.SpanID, swAgent, a+ms/2, b-ms/2,
			map[string]any{"network.local.port": float64(modelLocal), "server.port": float64(swModelPort)})
		w.span("SERVER", "POST /v1/responses", trace, cl.SpanID, swModel, a+ms/2+1000, b-ms/2-1000,
			map[string]any{"client.port": float64(modelLocal), "server.port": float64(swModelPort)})
	}
}

func newScorerWorld() *scorerWorld {
	w := &scorerWorld{}
	// Two rollouts interleaved in time, on different connections.
	w.rollout("0-0", 1_000_000_000, 50000, 51000)
	w.rollout("1-0", 1_005_000_000, 50001, 51001)
	return w
}

func (w *scorerWorld) find(f func(Span) bool) int {
	for i, s := range w.spans {
		if f(s) {
			return i
		}
	}
	panic("scorer test: no such span")
}

func TestCausalityScorer(t *testing.T) {
	pids := []int{swAgent, swModel}
	clientOf := func(port int, nth int) func(Span) bool {
		n := 0
		return func(s Span) bool {
			if s.Kind == "CLIENT" && s.AttrInt("network.local.port") == port {
				n++
				return n == nth+1
			}
			return false
		}
	}

	t.Run("all_right", func(t *testing.T) {
		w := newScorerWorld()
		s := scoreCausality(w.recs, w.spans, pids)
		if s.Outbound != 4 || s.ClientSpans != 4 || s.Correct != 4 || s.Wrong != 0 || s.Unattributed != 0 ||
			s.Inbound != 6 || s.ServerSpans != 6 || s.StraySpans != 0 ||
			s.Rollouts != 2 || s.RolloutsOneTrace != 2 || s.SharedTraces != 0 || s.Traces != 2 ||
			s.GymRolloutSpans != 2 || s.RolloutIDWrong != 0 || s.Accuracy() != 1 || s.Coverage() != 1 {
			t.Errorf("score %+v, want 4/4 right, 6/6 server spans, 2 rollouts in one trace each", s)
		}
	})

	t.Run("parent_from_another_rollout", func(t *testing.T) {
		w := newScorerWorld()
		other := w.spans[w.find(func(s Span) bool { return s.Name == "gym.rollout" && s.Attr("nemo.gym.rollout.id") == "1-0" })]
		i := w.find(clientOf(51000, 1))
		w.spans[i].Parent, w.spans[i].TraceID = other.SpanID, other.TraceID
		s := scoreCausality(w.recs, w.spans, pids)
		if s.Correct != 3 || s.Wrong != 1 || s.Attributed != 4 || s.RolloutsOneTrace != 1 || s.SharedTraces != 1 {
			t.Errorf("score %+v, want 3 right, 1 wrong, rollout 0-0 split over two traces, one shared", s)
		}
		if len(s.Examples) == 0 || !strings.Contains(s.Examples[0], "agent/o-0-0-1") {
			t.Errorf("examples %q do not name the wrong call agent/o-0-0-1", s.Examples)
		}
	})

	t.Run("parent_is_the_server_span", func(t *testing.T) {
		// With the rollout group off the CLIENT span hangs off /run itself.
		w := newScorerWorld()
		srv := w.spans[w.find(func(s Span) bool { return s.Name == "POST /run" && s.AttrInt("client.port") == 50000 })]
		w.spans[w.find(clientOf(51000, 0))].Parent = srv.SpanID
		if s := scoreCausality(w.recs, w.spans, pids); s.Correct != 4 {
			t.Errorf("score %+v, want 4 right", s)
		}
	})

	t.Run("parent_is_the_sibling_call", func(t *testing.T) {
		w := newScorerWorld()
		first := w.spans[w.find(clientOf(51000, 0))]
		w.spans[w.find(clientOf(51000, 1))].Parent = first.SpanID
		if s := scoreCausality(w.recs, w.spans, pids); s.Correct != 3 || s.Wrong != 1 {
			t.Errorf("score %+v, want 3 right, 1 wrong", s)
		}
	})

	t.Run("unattributed", func(t *testing.T) {
		w := newScorerWorld()
		i := w.find(clientOf(51001, 0))
		w.spans[i].Parent = ""
		w.spans[i].TraceID = fmt.Sprintf("%032x", 7)
		w.spans[i].Attributes["gymtrace.parent.unresolved"] = "ambiguous"
		s := scoreCausality(w.recs, w.spans, pids)
		if s.Correct != 3 || s.Wrong != 0 || s.Unattributed != 1 || s.Reasons["ambiguous"] != 1 ||
			s.Accuracy() != 1 || s.Coverage() != 0.75 || s.RolloutsOneTrace != 1 {
			t.Errorf("score %+v, want 3 right, 1 unattributed (ambiguous), accuracy 1, coverage 0.75", s)
		}
	})

	t.Run("missing_spans", func(t *testing.T) {
		w := newScorerWorld()
		drop := w.find(func(s Span) bool { return s.Kind == "SERVER" && s.PID() == swModel })
		w.spans = append(w.spans[:drop], w.spans[drop+1:]...)
		drop = w.find(clientOf(51001, 1))
		w.spans = append(w.spans[:drop], w.spans[drop+1:]...)
		s := scoreCausality(w.recs, w.spans, pids)
		if s.ServerSpans != 5 || s.Inbound != 6 || s.ClientSpans != 3 || s.Outbound != 4 || s.Correct != 3 {
			t.Errorf("score %+v, want 5/6 server spans, 3/4 client spans", s)
		}
	})

	t.Run("keep_alive_order", func(t *testing.T) {
		// The two calls on one connection must not be swapped even when the
		// span clock is off by a millisecond.
		w := newScorerWorld()
		for i := range w.spans {
			w.spans[i].Start += uint64(time.Millisecond)
			w.spans[i].End += uint64(time.Millisecond)
		}
		first := w.spans[w.find(clientOf(51000, 0))]
		// The second call's parent is the first call: wrong, and the scorer
		// must pin it on the second call, not the first.
		w.spans[w.find(clientOf(51000, 1))].Parent = first.SpanID
		s := scoreCausality(w.recs, w.spans, pids)
		if s.Wrong != 1 || len(s.Examples) == 0 || !strings.Contains(s.Examples[0], "agent/o-0-0-1") {
			t.Errorf("score %+v, want the second call (agent/o-0-0-1) wrong", s)
		}
	})

	t.Run("lost_response_record", func(t *testing.T) {
		// The first call's response record was lost: its span ends with its
		// request, which the kernel saw late in the call. Its start is then
		// nearer the second call's than its own; the pairing still keeps
		// the connection's order (a greedy pairing by cost gave the second
		// record this span and left the second span stray).
		w := newScorerWorld()
		ms := uint64(time.Millisecond)
		first := &w.spans[w.find(clientOf(51000, 0))]
		first.Start, first.End = first.Start+25*ms, first.Start+26*ms
		first.Attributes["gymtrace.record.lost"] = "response"
		// and the second call's response is read well before the app
		// records the call's end.
		w.spans[w.find(clientOf(51000, 1))].End -= 20 * ms
		s := scoreCausality(w.recs, w.spans, pids)
		if s.ClientSpans != s.Outbound || s.StraySpans != 0 || s.Wrong != 0 {
			t.Errorf("score %+v, want every call its own span, none stray, none wrong", s)
		}
	})

	t.Run("sandbox", func(t *testing.T) {
		w := newScorerWorld()
		ms := int64(time.Millisecond)
		run := func(rid string) Span {
			return w.spans[w.find(func(s Span) bool {
				return s.Name == "POST /run" && s.Attr("client.port") == map[string]string{"0-0": "50000", "1-0": "50001"}[rid]
			})]
		}
		// Rollout 0-0's /run spawns a CLI at +50 ms, 1-0's at +52 ms, and
		// 1-0's span is hung under 0-0's /run.
		for i, rid := range []string{"0-0", "1-0"} {
			t0 := run(rid).Start + uint64(50*ms) + uint64(i)*uint64(2*ms)
			w.recs = append(w.recs, truthRec{Ev: "spawn", ID: "agent/s-" + rid, Cause: "agent/i-" + rid, Verb: "exec", PID: swAgent,
				TStart: int64(t0), TEnd: int64(t0) + 20*ms, MonoStart: int64(t0), MonoEnd: int64(t0) + 20*ms})
			parent := run("0-0")
			w.span("INTERNAL", "gym.sandbox.exec", parent.TraceID, parent.SpanID, swAgent, int64(t0)+ms/2, int64(t0)+20*ms-ms/2, map[string]any{})
		}
		s := scoreCausality(w.recs, w.spans, pids)
		if s.Spawns != 2 || s.SandboxSpans != 2 || s.SpawnCorrect != 1 || s.SpawnWrong != 1 || s.RolloutsOneTrace != 1 || s.SandboxAmbiguous != 0 {
			t.Errorf("score %+v, want 2 spawns with spans, 1 right, 1 wrong, rollout 1-0 split", s)
		}
	})

	t.Run("sandbox_concurrent", func(t *testing.T) {
		// Two spawns at the same moment in one process, one per rollout: time
		// cannot tell their spans apart, so each span may hang under either
		// request, but not both under one.
		w, runs, t0 := concurrentSpawnWorld()
		ms := int64(time.Millisecond)
		for i, rid := range []string{"0-0", "1-0"} {
			w.recs = append(w.recs, truthRec{Ev: "spawn", ID: "agent/s-" + rid, Cause: "agent/i-" + rid, Verb: "exec", PID: swAgent,
				TStart: t0, TEnd: t0 + 20*ms, MonoStart: t0, MonoEnd: t0 + 20*ms})
			w.span("INTERNAL", "gym.sandbox.exec", runs[1-i].TraceID, runs[1-i].SpanID, swAgent, t0+ms/2, t0+20*ms-ms/2, map[string]any{})
		}
		if s := scoreCausality(w.recs, w.spans, pids); s.SpawnCorrect != 2 || s.SandboxAmbiguous != 2 {
			t.Errorf("swapped concurrent spawns: score %+v, want both right (indistinguishable) and ambiguous", s)
		}
		parent := runs[0]
		w.spans[len(w.spans)-1].Parent, w.spans[len(w.spans)-1].TraceID = parent.SpanID, parent.TraceID
		w.spans[len(w.spans)-2].Parent, w.spans[len(w.spans)-2].TraceID = parent.SpanID, parent.TraceID
		if s := scoreCausality(w.recs, w.spans, pids); s.SpawnCorrect != 1 || s.SpawnWrong != 1 {
			t.Errorf("both spans under one request: score %+v, want 1 right, 1 wrong", s)
		}
	})

	t.Run("sandbox_by_pid", func(t *testing.T) {
		// The same two concurrent spawns, the spans carrying the CLI's pid and
		// kernel times (GYMTRACE_DEBUG_RECORDS), and the wall clock stepped
		// 30 ms after gymtrace read its offset: each span is judged on its own
		// spawn, the wall times ignored, so a swap is seen.
		w, runs, t0 := concurrentSpawnWorld()
		ms := int64(time.Millisecond)
		step := 30 * ms
		for i, rid := range []string{"0-0", "1-0"} {
			w.recs = append(w.recs, truthRec{Ev: "spawn", ID: "agent/s-" + rid, Cause: "agent/i-" + rid, Verb: "exec", PID: swAgent,
				ChildPID: 7000 + i, TStart: t0 + step, TEnd: t0 + step + 20*ms, MonoStart: t0, MonoEnd: t0 + 20*ms})
			w.span("INTERNAL", "gym.sandbox.exec", runs[i].TraceID, runs[i].SpanID, swAgent, t0+ms/2, t0+20*ms-ms/2, map[string]any{
				"gymtrace.debug.pid": float64(7000 + i), "gymtrace.debug.start": float64(t0 + ms/2), "gymtrace.debug.end": float64(t0 + 20*ms - ms/2)})
		}
		if s := scoreCausality(w.recs, w.spans, pids); s.SpawnCorrect != 2 || s.SandboxAmbiguous != 0 || s.SandboxStray != 0 {
			t.Errorf("wall clock stepped: score %+v, want both right, by pid: none ambiguous, none stray", s)
		}
		a, b := &w.spans[len(w.spans)-2], &w.spans[len(w.spans)-1]
		a.Parent, a.TraceID, b.Parent, b.TraceID = b.Parent, b.TraceID, a.Parent, a.TraceID
		if s := scoreCausality(w.recs, w.spans, pids); s.SpawnCorrect != 0 || s.SpawnWrong != 2 {
			t.Errorf("swapped concurrent spawns: score %+v, want both wrong (the pids tell them apart)", s)
		}
	})

	t.Run("collector_not_traced", func(t *testing.T) {
		w := newScorerWorld()
		s := scoreCausality(w.recs, w.spans, []int{swAgent})
		// The model is not traced: its ins are not expected, and its SERVER
		// spans are strays from that view.
		if s.Inbound != 2 || s.ServerSpans != 2 || s.Outbound != 4 || s.StraySpans != 4 {
			t.Errorf("score %+v, want 2 inbound (agent /run), 4 outbound, 4 stray model spans", s)
		}
	})
}

// A span is paired with a truth record of its own path: on a keep-alive
// connection a call stamped first can be written second, after waiting for
// the connection, and with the other call's span lost (its record lost),
// time alone pairs the remaining span with the wrong call (seen in CI: a
// /verify span taken for another rollout's /seed_session, scored as a
// wrong parent, a wrong rollout id and a shared trace that were not).
func TestMatchByPortsPaths(t *testing.T) {
	ms := int64(time.Millisecond)
	key := truthAddr{"h", 48358}
	recs := []truthRec{
		{Ev: "out", ID: "verify", Method: "POST", Path: "/verify", Local: key, Remote: truthAddr{"h", 9002}, TStart: 0, TEnd: 50 * ms, PID: 10},
		{Ev: "out", ID: "seed", Method: "POST", Path: "/seed_session", Local: key, Remote: truthAddr{"h", 9002}, TStart: 10 * ms, TEnd: 60 * ms, PID: 10},
	}
	spans := []Span{{Kind: "CLIENT", SpanID: "s", Start: uint64(30 * ms), End: uint64(35 * ms), Resource: map[string]any{"process.pid": float64(10)},
		Attributes: map[string]any{"network.local.port": float64(48358), "server.port": float64(9002),
			"url.full": "http://h:9002/verify", "gymtrace.record.lost": "response"}}}
	got := matchByPorts(recs, func(r truthRec) (joinKey, bool) { return joinKey{r.PID, r.Local.Port, r.Remote.Port}, true },
		spans, func(s Span) (joinKey, bool) {
			return joinKey{s.PID(), s.AttrInt("network.local.port"), s.AttrInt("server.port")}, true
		})
	if j, ok := got[0]; len(got) != 1 || !ok || j != 0 {
		t.Errorf("pairs %v: want the /verify record (0) paired with the /verify span", got)
	}
	for _, c := range []struct {
		truth, span string
		want        bool
	}{{"/verify", "/verify", true}, {"/verify", "/seed_session", false}, {"/v1/responses", "", true},
		{"/a?x=1", "/a", true}, {"/ng-rollout/7/v1/responses", "/ng-rollout/7/v1/resp", true}} {
		if got := samePath(c.truth, c.span); got != c.want {
			t.Errorf("samePath(%q, %q) = %v, want %v", c.truth, c.span, got, c.want)
		}
	}
}

// A SERVER span is paired by the kernel's start where it carries one: its
// request was read before its handler began, so the request before it on
// the connection, whose handler began before that read, cannot be its
// record, however close the wall times (seen in CI, under load: a model
// span whose response record was lost, read 1 ms after the previous
// request's truth ended, its own handler 8 ms late; by wall time it was
// paired with the previous request, another rollout's, and scored as a
// trace shared by two rollouts).
func TestMatchByPortsKernelTime(t *testing.T) {
	ms := int64(time.Millisecond)
	at := func(d int64) int64 { return 1_000_000*ms + d*ms } // a clock that started long ago
	peer, local := truthAddr{"h", 57868}, truthAddr{"h", 9002}
	recs := []truthRec{
		{Ev: "in", ID: "previous", Method: "POST", Path: "/v1/responses", Local: local, Peer: peer,
			TStart: at(0), TEnd: at(5), MonoStart: at(0), MonoEnd: at(5), PID: 20},
		{Ev: "in", ID: "own", Method: "POST", Path: "/v1/responses", Local: local, Peer: peer,
			TStart: at(14), TEnd: at(20), MonoStart: at(14), MonoEnd: at(20), PID: 20},
	}
	span := func(debug bool) []Span {
		attrs := map[string]any{"client.port": float64(peer.Port), "server.port": float64(local.Port),
			"url.path": "/v1/responses", "gymtrace.record.lost": "response"}
		if debug {
			attrs["gymtrace.debug.req_start"] = float64(at(6))
		}
		return []Span{{Kind: "SERVER", SpanID: "s", Start: uint64(at(6)), End: uint64(at(6)),
			Resource: map[string]any{"process.pid": float64(20)}, Attributes: attrs}}
	}
	match := func(spans []Span) map[int]int {
		return matchByPorts(recs, func(r truthRec) (joinKey, bool) { return joinKey{r.PID, r.Peer.Port, r.Local.Port}, true },
			spans, func(s Span) (joinKey, bool) {
				return joinKey{s.PID(), s.AttrInt("client.port"), s.AttrInt("server.port")}, true
			})
	}
	if got := match(span(true)); len(got) != 1 || !hasPair(got, 1, 0) {
		t.Errorf("with the kernel's start: pairs %v, want the span's own request (1)", got)
	}
	// Without it the wall times cannot tell: the scorer pairs by them, and
	// this shape is why the e2e runs carry the kernel's start.
	if got := match(span(false)); len(got) != 1 {
		t.Errorf("by wall time: pairs %v, want one pair", got)
	}
	if r, ok := truthAt(recs, at(6), false, "/v1/responses"); !ok || r.ID != "own" {
		t.Errorf("truthAt for a request read at 6 ms: %v %v, want own", r.ID, ok)
	}
	if _, ok := truthAt(recs, at(21), true, "/v1/responses"); ok {
		t.Errorf("truthAt for a call written after every record ended: found one, want none")
	}
}

func hasPair(m map[int]int, i, j int) bool {
	v, ok := m[i]
	return ok && v == j
}

// concurrentSpawnWorld: the scorer's world, its two rollouts' /run spans,
// and a moment 50 ms into the later one, when both are in flight.
func concurrentSpawnWorld() (*scorerWorld, []Span, int64) {
	w := newScorerWorld()
	var runs []Span
	for _, port := range []int{50000, 50001} {
		runs = append(runs, w.spans[w.find(func(s Span) bool { return s.Name == "POST /run" && s.AttrInt("client.port") == port })])
	}
	return w, runs, int64(runs[1].Start) + 50*int64(time.Millisecond)
}
