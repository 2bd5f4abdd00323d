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
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

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
	// RolloutsTouched: rollouts a lost record touched: one of their requests
	// has no span, or a span gymtrace marked (gymtrace.record.lost: its
	// response record was lost; gymtrace.connection.gap: a record of its
	// connection was lost just before it). RolloutsWhole: every request a
	// span, all in one trace. RolloutsUntouchedSplit: untouched, yet not
	// whole (what loss must never cause).
	RolloutsTouched        int
	RolloutsWhole          int
	RolloutsUntouchedSplit int
	// RolloutsSpannedSplit: every request a span, yet in more than one
	// trace (a loss broke a join, not a span).
	RolloutsSpannedSplit int
	RolloutsNoRun        int // ... whose /run has no SERVER span
	Traces               int // distinct trace ids over all exported spans
	SharedTraces         int // traces holding spans of more than one rollout
	RolloutIDSpans       int // spans carrying nemo.gym.rollout.id
	RolloutIDWrong       int // ... whose value is not their rollout's
	GymRolloutSpans      int // gym.rollout spans carrying their rollout's id

	Examples      []string // the first wrong or missing cases, for the log
	WrongExamples []string // the first wrong parents
}

// wrong records a wrong parent among the first findings and, apart, among
// the first wrong parents (missing spans can fill the findings first).
func (s *causalityScore) wrong(format string, args ...any) {
	s.example(format, args...)
	if len(s.WrongExamples) < 8 {
		s.WrongExamples = append(s.WrongExamples, fmt.Sprintf(format, args...))
	}
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
			sc.wrong("%v: its cause has no SERVER span, yet the CLIENT span has parent %s", r, c.Parent)
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
		sc.wrong("%v%s: CLIENT span's parent is %s, want %v or the gym.* span under it", r, bracket(debugAttrs(c)), got, want)
	}

	// Sandbox spans: placed by process, verb and spawnContains: under
	// GYMTRACE_DEBUG_RECORDS by the CLI's pid and kernel times, exactly; else
	// by wall time, and concurrent spawns of one verb in one process then give
	// several candidates; such a span is right when its parent is the request
	// of one of them (SandboxAmbiguous counts these, as a swap between them
	// cannot be seen from outside).
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
			if spawnContains(spawns[i], sb) {
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
	traceSpans := map[string]map[string][]string{} // trace -> rollout -> its spans there, for a shared trace's finding
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
		touched, missing := false, false
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
			} else {
				touched, missing = true, true
				if in.ID == run.ID {
					sc.RolloutsNoRun++
				}
			}
			rs = append(rs, sandboxByCause[in.ID]...)
			for _, oi := range outsByCause[in.ID] {
				if si, ok := outSpan[oi]; ok {
					rs = append(rs, spans[si])
				} else {
					touched, missing = true, true
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
			if s.Attr("gymtrace.record.lost") != "" || s.Attributes["gymtrace.connection.gap"] == true {
				touched = true
			}
			if traceRollouts[s.TraceID] == nil {
				traceRollouts[s.TraceID] = map[string]bool{}
			}
			traceRollouts[s.TraceID][rid] = true
			if traceSpans[s.TraceID] == nil {
				traceSpans[s.TraceID] = map[string][]string{}
			}
			traceSpans[s.TraceID][rid] = append(traceSpans[s.TraceID][rid], s.String())
			if v := s.Attr("nemo.gym.rollout.id"); v != "" {
				sc.RolloutIDSpans++
				if v != rid {
					sc.RolloutIDWrong++
					sc.example("rollout %s: span %v carries nemo.gym.rollout.id=%s", rid, s, v)
				}
			}
		}
		whole := !missing && len(ids) == 1
		if whole {
			sc.RolloutsWhole++
		} else if !missing {
			sc.RolloutsSpannedSplit++
		}
		if touched {
			sc.RolloutsTouched++
		} else if !whole {
			sc.RolloutsUntouchedSplit++
		}
		if len(ids) == 1 {
			sc.RolloutsOneTrace++
		} else {
			sc.example("rollout %s: %d spans in %d traces", rid, len(rs), len(ids))
		}
	}
	for tid, rollouts := range traceRollouts {
		if len(rollouts) > 1 {
			sc.SharedTraces++
			// Which spans put each rollout there: the fewest name the stray.
			var parts []string
			for rid, ss := range traceSpans[tid] {
				if len(ss) > 3 {
					parts = append(parts, fmt.Sprintf("rollout %s: %d spans", rid, len(ss)))
				} else {
					parts = append(parts, fmt.Sprintf("rollout %s: %s", rid, strings.Join(ss, ", ")))
				}
			}
			sort.Strings(parts)
			sc.wrong("trace %s holds %d rollouts: %s", tid, len(rollouts), strings.Join(parts, "; "))
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
