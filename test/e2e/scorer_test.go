//go:build linux

package e2e

// The causality scorer: compares exported spans (gymtrace's jsonl or the OTLP
// sink's file) with the ground truth the test stack logs (launch.py --truth,
// test/stack/README.md). The truth names, for every outbound call a server
// made, the inbound request whose handler made it; those ids live only inside
// the Python processes, so gymtrace cannot have seen them. Records and spans
// are joined by what both sides observe: the process, the TCP ports and the
// time.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// --- ground truth ----------------------------------------------------------------

// truthAddr is a truth address, [host, port] in the file.
type truthAddr struct {
	Host string
	Port int
}

func (a *truthAddr) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = truthAddr{}
		return nil
	}
	var pair []any
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("address %s is not [host, port]: %w", b, err)
	}
	if len(pair) != 2 {
		return fmt.Errorf("address %s is not [host, port]", b)
	}
	a.Host = anyString(pair[0])
	a.Port = anyInt(pair[1])
	return nil
}

// truthRec is one ground-truth line.
type truthRec struct {
	Ev        string    `json:"ev"`
	ID        string    `json:"id"`
	Cause     string    `json:"cause"` // "" for null (the collector's calls)
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	Route     string    `json:"route"`
	Local     truthAddr `json:"local"`
	Peer      truthAddr `json:"peer"`
	Remote    truthAddr `json:"remote"`
	Status    int       `json:"status"`
	Error     string    `json:"error"`
	RolloutID string    `json:"rollout_id"`
	ChildPID  int       `json:"child_pid"`
	TStart    int64     `json:"t_start"`
	TEnd      int64     `json:"t_end"`
	MonoStart int64     `json:"mono_start"`
	MonoEnd   int64     `json:"mono_end"`
	Verb      string    `json:"verb"`
	Server    string    `json:"server"`
	Type      string    `json:"type"`
	PID       int       `json:"pid"`
}

func (r truthRec) String() string {
	switch r.Ev {
	case "in":
		return fmt.Sprintf("in %s %s %s (pid %d, peer port %d)", r.ID, r.Method, r.Path, r.PID, r.Peer.Port)
	case "out":
		return fmt.Sprintf("out %s %s %s cause=%s (pid %d, local port %d)", r.ID, r.Method, r.Path, r.Cause, r.PID, r.Local.Port)
	}
	return fmt.Sprintf("%s %s (pid %d)", r.Ev, r.ID, r.PID)
}

// readTruth reads a truth file, keeping the records that started at or after
// sinceMono (CLOCK_MONOTONIC ns; 0 keeps all). The stack's processes flush
// every 200 ms, so read it once they have had time to.
func readTruth(path string, sinceMono int64) ([]truthRec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the ground truth: %w", err)
	}
	var out []truthRec
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r truthRec
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s line %d is not a truth record (two stacks writing one file?): %w: %s",
				path, i+1, err, tail(string(line), 200))
		}
		if r.Ev == "start" || r.MonoStart >= sinceMono {
			out = append(out, r)
		}
	}
	return out, nil
}

// --- joining spans to records ----------------------------------------------------

// matchSlack absorbs gymtrace's conversion of kernel monotonic time to wall
// time and the distance between a syscall and the Python line that logged the
// truth.
const matchSlack = int64(2 * time.Millisecond)

type joinKey struct {
	pid, port, serverPort int
}

// matchByPorts pairs records with spans one to one. Candidates share the key
// (process and the connection's ports); a keep-alive connection carries its
// requests one after another, so among candidates whose intervals overlap
// (with slack) the pairs closest in start and end win, globally greedy.
func matchByPorts(recs []truthRec, recKey func(truthRec) (joinKey, bool),
	spans []Span, spanKey func(Span) (joinKey, bool)) map[int]int {
	byKey := map[joinKey][]int{}
	for i, s := range spans {
		if k, ok := spanKey(s); ok {
			byKey[k] = append(byKey[k], i)
		}
	}
	type cand struct {
		rec, span int
		cost      int64
	}
	var cands []cand
	for ri, r := range recs {
		k, ok := recKey(r)
		if !ok {
			continue
		}
		for _, si := range byKey[k] {
			s := spans[si]
			ss, se := int64(s.Start), int64(s.End)
			if ss > r.TEnd+matchSlack || r.TStart > se+matchSlack {
				continue
			}
			cands = append(cands, cand{ri, si, abs64(ss-r.TStart) + abs64(se-r.TEnd)})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].cost != cands[j].cost {
			return cands[i].cost < cands[j].cost
		}
		if cands[i].rec != cands[j].rec {
			return cands[i].rec < cands[j].rec
		}
		return cands[i].span < cands[j].span
	})
	out := map[int]int{}
	used := map[int]bool{}
	for _, c := range cands {
		if _, done := out[c.rec]; done || used[c.span] {
			continue
		}
		out[c.rec] = c.span
		used[c.span] = true
	}
	return out
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// truthJoin pairs each server-to-server out with the in it produced on the
// other side, exactly as truthcheck.py does: the out's local address is the
// in's peer, the out's remote port the in's local port, and the in lies
// inside the out in monotonic time.
func truthJoin(recs []truthRec) map[string]truthRec {
	byPorts := map[[2]int][]truthRec{}
	for _, r := range recs {
		if r.Ev == "in" && r.Peer.Port != 0 {
			k := [2]int{r.Peer.Port, r.Local.Port}
			byPorts[k] = append(byPorts[k], r)
		}
	}
	out := map[string]truthRec{}
	for _, o := range recs {
		if o.Ev != "out" || o.Error != "" || o.Local.Port == 0 {
			continue
		}
		var found []truthRec
		for _, in := range byPorts[[2]int{o.Local.Port, o.Remote.Port}] {
			if o.MonoStart <= in.MonoStart && in.MonoEnd <= o.MonoEnd {
				found = append(found, in)
			}
		}
		if len(found) == 1 {
			out[o.ID] = found[0]
		}
	}
	return out
}

// --- the score -------------------------------------------------------------------

// causalityScore is what one traced collection scored against its truth.
type causalityScore struct {
	// Outbound calls made by a traced server (truth out with a cause).
	Outbound     int
	ClientSpans  int            // ... that have a CLIENT span
	Attributed   int            // ... whose CLIENT span has a parent
	Correct      int            // ... that parent is the cause's SERVER span or the gym.* span under it
	Wrong        int            // attributed elsewhere (includes a cause without a SERVER span)
	Unattributed int            // CLIENT span without a parent
	Reasons      map[string]int // gymtrace.parent.unresolved of the unattributed ("" when none given)

	// Sandbox CLIs spawned by a traced server (truth spawn) and the
	// gym.sandbox.* spans of traced servers, matched by time (see
	// scoreCausality).
	Spawns            int
	SpawnsCovered     int // spawns containing at least one sandbox span
	SandboxSpans      int
	SpawnCorrect      int // sandbox spans under the request of a spawn containing them
	SpawnWrong        int
	SpawnUnattributed int
	SandboxAmbiguous  int // sandbox spans contained in several spawns
	SandboxStray      int // sandbox spans no spawn contains

	// Inbound requests served by a traced server (truth in, without the
	// launcher's readiness GET /).
	Inbound     int
	ServerSpans int // ... that have a SERVER span
	// SERVER and CLIENT spans no truth record explains.
	StraySpans int

	// Rollouts: the collector's calls of /run in the window.
	Rollouts         int
	RolloutsOneTrace int // ... whose spans all lie in one trace
	RolloutsNoRun    int // ... whose /run has no SERVER span
	Traces           int // distinct trace ids over all exported spans
	SharedTraces     int // traces holding spans of more than one rollout
	RolloutIDSpans   int // spans carrying nemo.gym.rollout.id
	RolloutIDWrong   int // ... whose value is not their rollout's
	GymRolloutSpans  int // gym.rollout spans carrying their rollout's id

	Examples []string // the first wrong or missing cases, for the log
}

func (s causalityScore) Accuracy() float64 { return ratio(s.Correct, s.Attributed) }
func (s causalityScore) Coverage() float64 { return ratio(s.Attributed, s.Outbound) }

func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

func (s *causalityScore) example(format string, args ...any) {
	if len(s.Examples) < 8 {
		s.Examples = append(s.Examples, fmt.Sprintf(format, args...))
	}
}

// ReasonsString lists the unattributed reasons, most frequent first.
func (s causalityScore) ReasonsString() string {
	if len(s.Reasons) == 0 {
		return "-"
	}
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range s.Reasons {
		if k == "" {
			k = "(none)"
		}
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v || list[i].v == list[j].v && list[i].k < list[j].k })
	var parts []string
	for _, x := range list {
		parts = append(parts, fmt.Sprintf("%s:%d", x.k, x.v))
	}
	return strings.Join(parts, " ")
}

// scoreCausality scores spans against truth records. tracedPIDs are the
// processes gymtrace traced: calls and requests of others (the collector) are
// not expected to have spans.
func scoreCausality(recs []truthRec, spans []Span, tracedPIDs []int) causalityScore {
	sc := causalityScore{Reasons: map[string]int{}}
	traced := map[int]bool{}
	for _, p := range tracedPIDs {
		traced[p] = true
	}

	var ins, outs, collectorOuts, spawns []truthRec
	for _, r := range recs {
		switch {
		case r.Ev == "spawn" && traced[r.PID] && r.Cause != "":
			spawns = append(spawns, r)
		case r.Ev == "in" && traced[r.PID] && !(r.Method == "GET" && r.Path == "/"):
			ins = append(ins, r)
		case r.Ev == "out" && traced[r.PID] && r.Cause != "":
			outs = append(outs, r)
		case r.Ev == "out" && r.Cause == "" && r.Path == "/run":
			collectorOuts = append(collectorOuts, r)
		}
	}
	byID := map[string]Span{}
	children := map[string][]Span{} // parent span id -> spans
	for _, s := range spans {
		byID[s.SpanID] = s
		if s.Parent != "" {
			children[s.Parent] = append(children[s.Parent], s)
		}
	}

	inSpan := matchByPorts(ins, func(r truthRec) (joinKey, bool) {
		return joinKey{r.PID, r.Peer.Port, r.Local.Port}, r.Peer.Port != 0
	}, spans, func(s Span) (joinKey, bool) {
		return joinKey{s.PID(), s.AttrInt("client.port"), s.AttrInt("server.port")}, s.Kind == "SERVER"
	})
	outSpan := matchByPorts(outs, func(r truthRec) (joinKey, bool) {
		return joinKey{r.PID, r.Local.Port, r.Remote.Port}, r.Local.Port != 0
	}, spans, func(s Span) (joinKey, bool) {
		return joinKey{s.PID(), s.AttrInt("network.local.port"), s.AttrInt("server.port")}, s.Kind == "CLIENT"
	})
	serverOf := map[string]Span{} // in id -> SERVER span
	for ri, si := range inSpan {
		serverOf[ins[ri].ID] = spans[si]
	}
	explained := map[string]bool{}
	for _, si := range inSpan {
		explained[spans[si].SpanID] = true
	}
	for _, si := range outSpan {
		explained[spans[si].SpanID] = true
	}

	// Every request a span.
	sc.Inbound, sc.ServerSpans = len(ins), len(inSpan)
	for ri, r := range ins {
		if _, ok := inSpan[ri]; !ok {
			sc.example("no SERVER span for %v", r)
		}
	}
	for _, s := range spans {
		if (s.Kind == "SERVER" || s.Kind == "CLIENT") && !explained[s.SpanID] {
			sc.StraySpans++
			sc.example("no truth record for span %v", s)
		}
	}

	// Parents.
	sc.Outbound = len(outs)
	for ri, r := range outs {
		si, ok := outSpan[ri]
		if !ok {
			sc.example("no CLIENT span for %v", r)
			continue
		}
		sc.ClientSpans++
		c := spans[si]
		if c.Parent == "" {
			sc.Unattributed++
			sc.Reasons[c.Attr("gymtrace.parent.unresolved")]++
			continue
		}
		sc.Attributed++
		want, ok := serverOf[r.Cause]
		if !ok {
			sc.Wrong++
			sc.example("%v: its cause has no SERVER span, yet the CLIENT span has parent %s", r, c.Parent)
			continue
		}
		p, pok := byID[c.Parent]
		if c.Parent == want.SpanID || pok && p.Kind == "INTERNAL" && strings.HasPrefix(p.Name, "gym.") && p.Parent == want.SpanID {
			sc.Correct++
			continue
		}
		sc.Wrong++
		got := "an unexported span " + c.Parent
		if pok {
			got = p.String()
		}
		sc.example("%v: CLIENT span's parent is %s, want %v or the gym.* span under it", r, got, want)
	}

	// Sandbox spans: no attribute names the child process, so a span can only
	// be placed by process, verb and time: its candidates are the spawns whose
	// interval (spawn call to wait) contains it. Concurrent spawns of one verb
	// in one process give several candidates; such a span is right when its
	// parent is the request of one of them (SandboxAmbiguous counts these, as
	// a swap between them cannot be seen from outside).
	verbOf := map[string]string{"gym.sandbox.start": "start", "gym.sandbox.exec": "exec"}
	spawnsByKey := map[[2]any][]int{}
	for i, r := range spawns {
		k := [2]any{r.PID, r.Verb}
		spawnsByKey[k] = append(spawnsByKey[k], i)
	}
	covered := map[int]bool{}
	heldRight := map[string]int{} // request span id -> sandbox spans judged right under it
	sandboxByCause := map[string][]Span{}
	sc.Spawns = len(spawns)
	for _, sb := range spans {
		verb, ok := verbOf[sb.Name]
		if !ok || sb.Kind != "INTERNAL" || !traced[sb.PID()] {
			continue
		}
		sc.SandboxSpans++
		var cands []int
		for _, i := range spawnsByKey[[2]any{sb.PID(), verb}] {
			r := spawns[i]
			if int64(sb.Start)+matchSlack >= r.TStart && int64(sb.End) <= r.TEnd+matchSlack {
				cands = append(cands, i)
			}
		}
		if len(cands) == 0 {
			sc.SandboxStray++
			sc.example("no spawn of the truth contains sandbox span %v", sb)
			continue
		}
		if len(cands) > 1 {
			sc.SandboxAmbiguous++
		}
		cause := spawns[cands[0]].Cause
		for _, i := range cands {
			covered[i] = true
			if want, ok := serverOf[spawns[i].Cause]; ok && sb.Parent == want.SpanID {
				cause = spawns[i].Cause
			}
		}
		sandboxByCause[cause] = append(sandboxByCause[cause], sb)
		want, ok := serverOf[cause]
		switch {
		case sb.Parent == "":
			sc.SpawnUnattributed++
			sc.Reasons["sandbox:"+sb.Attr("gymtrace.parent.unresolved")]++
		case ok && sb.Parent == want.SpanID:
			sc.SpawnCorrect++
			heldRight[sb.Parent]++
		default:
			sc.SpawnWrong++
			sc.example("sandbox span %v: parent %s is the request of none of the %d spawns that contain it (first: %v)",
				sb, sb.Parent, len(cands), spawns[cands[0]])
		}
	}
	sc.SpawnsCovered = len(covered)
	// Each request spawns a known number of CLIs: a request holding more
	// sandbox spans than it spawned has taken another's, whatever the times.
	spawnsOf := map[string]int{} // SERVER span id -> spawns its request made
	for _, r := range spawns {
		if want, ok := serverOf[r.Cause]; ok {
			spawnsOf[want.SpanID]++
		}
	}
	for parent, n := range heldRight {
		if want := spawnsOf[parent]; n > want && want > 0 {
			sc.SpawnCorrect -= n - want
			sc.SpawnWrong += n - want
			sc.example("request span %s holds %d sandbox spans but spawned %d CLIs", parent, n, want)
		}
	}
	for i, r := range spawns {
		if !covered[i] {
			sc.example("no gym.sandbox span for %v (verb %s)", r, r.Verb)
		}
	}

	// Traces per rollout: a rollout is one collector call of /run; its records
	// are the /run in it produced and, transitively, the calls each in's
	// handler made and the ins those produced.
	joined := truthJoin(recs)
	outsByCause := map[string][]int{}
	for i, r := range outs {
		outsByCause[r.Cause] = append(outsByCause[r.Cause], i)
	}
	inIndex := map[string]int{}
	for i, r := range ins {
		inIndex[r.ID] = i
	}
	traceRollouts := map[string]map[string]bool{}
	for _, s := range spans {
		traceRollouts[s.TraceID] = nil
	}
	sc.Traces = len(traceRollouts)
	sc.Rollouts = len(collectorOuts)
	for _, co := range collectorOuts {
		run, ok := joined[co.ID]
		if !ok {
			sc.example("collector call %v produced no /run in the truth", co)
			continue
		}
		rid := co.RolloutID
		var rs []Span // the rollout's spans
		queue := []truthRec{run}
		for len(queue) > 0 {
			in := queue[0]
			queue = queue[1:]
			if s, ok := serverOf[in.ID]; ok {
				rs = append(rs, s)
				for _, ch := range children[s.SpanID] {
					if ch.Kind == "INTERNAL" {
						rs = append(rs, ch)
						if ch.Name == "gym.rollout" && ch.Attr("nemo.gym.rollout.id") == rid {
							sc.GymRolloutSpans++
						}
					}
				}
			} else if in.ID == run.ID {
				sc.RolloutsNoRun++
			}
			rs = append(rs, sandboxByCause[in.ID]...)
			for _, oi := range outsByCause[in.ID] {
				if si, ok := outSpan[oi]; ok {
					rs = append(rs, spans[si])
				}
				if next, ok := joined[outs[oi].ID]; ok {
					if _, traced := inIndex[next.ID]; traced {
						queue = append(queue, next)
					}
				}
			}
		}
		ids := map[string]bool{}
		for _, s := range rs {
			ids[s.TraceID] = true
			if traceRollouts[s.TraceID] == nil {
				traceRollouts[s.TraceID] = map[string]bool{}
			}
			traceRollouts[s.TraceID][rid] = true
			if v := s.Attr("nemo.gym.rollout.id"); v != "" {
				sc.RolloutIDSpans++
				if v != rid {
					sc.RolloutIDWrong++
					sc.example("rollout %s: span %v carries nemo.gym.rollout.id=%s", rid, s, v)
				}
			}
		}
		if len(ids) == 1 {
			sc.RolloutsOneTrace++
		} else {
			sc.example("rollout %s: %d spans in %d traces", rid, len(rs), len(ids))
		}
	}
	for _, rollouts := range traceRollouts {
		if len(rollouts) > 1 {
			sc.SharedTraces++
		}
	}
	return sc
}

// --- the report --------------------------------------------------------------------

// causalityRow is one line of the figures table.
type causalityRow struct {
	Python, HTTP, Loop, Middleware, Groups string
	Concurrency, Rollouts                  int
	Score                                  causalityScore
	Elapsed                                time.Duration
}

func causalityTable(rows []causalityRow) string {
	var b strings.Builder
	b.WriteString("| python | http | loop | BaseHTTPMiddleware | groups | c | rollouts | outbound | correct | wrong | unattributed (reasons) | accuracy | coverage | server spans | client spans | stray | one trace / rollouts | traces | sandbox spans right/all (spawns) | time |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		s := r.Score
		sandbox := "-"
		if s.Spawns > 0 {
			sandbox = fmt.Sprintf("%d/%d (%d spawns)", s.SpawnCorrect, s.SandboxSpans, s.Spawns)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %d | %d | %d | %d | %d (%s) | %s | %s | %d/%d | %d/%d | %d | %d/%d | %d | %s | %.1fs |\n",
			r.Python, r.HTTP, r.Loop, r.Middleware, r.Groups, r.Concurrency, r.Rollouts,
			s.Outbound, s.Correct, s.Wrong, s.Unattributed, s.ReasonsString(), pct(s.Accuracy()), pct(s.Coverage()),
			s.ServerSpans, s.Inbound, s.ClientSpans, s.Outbound, s.StraySpans, s.RolloutsOneTrace, s.Rollouts, s.Traces,
			sandbox, r.Elapsed.Seconds())
	}
	return b.String()
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f %%", 100*x)
}

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
		w := newScorerWorld()
		ms := int64(time.Millisecond)
		var runs []Span
		for _, port := range []int{50000, 50001} {
			runs = append(runs, w.spans[w.find(func(s Span) bool { return s.Name == "POST /run" && s.AttrInt("client.port") == port })])
		}
		t0 := int64(runs[1].Start) + 50*ms
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
