//go:build linux

package spans

import (
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// The kernel may deliver the server's REQUEST before the client's when the two
// sides race across CPUs: the join must still happen.
func TestLateClientRecordStillJoins(t *testing.T) {
	s := newSim(t, "per_rollout")
	s.lateCli = true
	g := newGymStack(s, false)
	g.rollout(0, 1, 1)
	diffEdges(t, edges(t, s.spans), rolloutTrees["per_rollout"])
	if traces(s.spans) != 1 {
		t.Errorf("%d traces, want 1", traces(s.spans))
	}
	if st := s.b.Stats(); st.LateJoins == 0 {
		t.Error("no late joins counted")
	}
}

// On a busy machine the server's read can return milliseconds before the
// client's write does (the woken reader preempts the writer). On a
// connection the kernel followed from its first byte (FlagFresh) the pairing
// is by request index and holds; on one picked up mid-stream without stream
// positions nothing proves a pair, whatever the timing: unjoined.
func TestJoinWhenTheWriterReturnsLate(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		s := newSim(t, "server,http_client")
		s.midStream = !fresh
		s.lateCli, s.cliLag = true, uint64(20*time.Millisecond)
		c := s.dial(pidAgent, pidResources, resAddr)
		var opts []reqOpt
		if fresh {
			opts = append(opts, withFlags(loader.FlagFresh))
		}
		c.request(loader.MethodPOST, "/get_weather", opts...).respond(200)
		c.request(loader.MethodPOST, "/verify", opts...).respond(200)
		joined, _ := serverJoins(s.spans)
		if want := map[bool]int{true: 2, false: 0}[fresh]; joined != want {
			t.Errorf("fresh=%v: %d of 2 server spans joined to their client span, want %d", fresh, joined, want)
		}
	}
}

func TestPipelinedRequestsJoinInOrder(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	a := c.request(loader.MethodPOST, "/a")
	b := c.request(loader.MethodPOST, "/b")
	a.respond(200)
	b.respond(201)
	got := edges(t, s.spans)
	diffEdges(t, got, []string{
		e("simple_agent:HTTP POST ->resources/a", ""),
		e("simple_agent:HTTP POST ->resources/b", ""),
		e("weather:POST /a", "simple_agent:HTTP POST ->resources/a"),
		e("weather:POST /b", "simple_agent:HTTP POST ->resources/b"),
	})
	for _, sp := range findSpans(s.spans, "POST /b") {
		mustAttr(t, sp, "http.response.status_code", 201)
	}
}

// Two rollouts in flight on one agent: a call from a /run handler could be
// either's. Never guess.
func TestAmbiguousParentsAreRoots(t *testing.T) {
	s := newSim(t, "default")
	g := newGymStack(s, false)
	r0 := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
	r1 := g.collAgent[1].request(loader.MethodPOST, "/run", withRollout(1, 1, -1))
	g.agentRes[0].request(loader.MethodPOST, "/seed_session").respond(200)
	r0.respond(200)
	g.agentRes[1].request(loader.MethodPOST, "/seed_session").respond(200) // only r1 left: resolvable
	r1.respond(200)
	clients := findSpans(s.spans, "HTTP POST")
	if len(clients) != 2 {
		t.Fatalf("%d client spans", len(clients))
	}
	amb, ok := clients[0], clients[1]
	if amb.Parent.IsValid() {
		t.Errorf("ambiguous call got a parent")
	}
	mustAttr(t, amb, "gymtrace.parent.unresolved", "ambiguous")
	noAttr(t, amb, "nemo.gym.rollout.id")
	if !ok.Parent.IsValid() {
		t.Errorf("call with one /run in flight is a root")
	}
	noAttr(t, ok, "gymtrace.parent.unresolved")
	mustAttr(t, ok, "nemo.gym.rollout.id", "1-1")
	if st := s.b.Stats(); st.ParentAmbiguous != 1 {
		t.Errorf("ParentAmbiguous = %d", st.ParentAmbiguous)
	}
}

// With asyncio contexts bound (issue 4), concurrent rollouts resolve exactly.
func TestContextBindingResolvesConcurrency(t *testing.T) {
	s := newSim(t, "default")
	g := newGymStack(s, false)
	runs := []*call{
		g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1)),
		g.collAgent[1].request(loader.MethodPOST, "/run", withRollout(1, 1, -1)),
	}
	// The handler task of each /run gets a Context; a gather child copies it.
	for i, c := range g.collAgent[:2] {
		ctx := uint64(0x1000 + i)
		if !s.b.BindContext(pidAgent, ctx, 0, c.srvConn) {
			t.Fatal("BindContext by connection failed")
		}
		if !s.b.BindContext(pidAgent, ctx+0x100, ctx, 0) {
			t.Fatal("BindContext by parent context failed")
		}
	}
	g.agentRes[1].request(loader.MethodPOST, "/seed_session", withCtx(0x1001)).respond(200)
	g.agentRes[0].request(loader.MethodPOST, "/seed_session", withCtx(0x1100)).respond(200)
	for _, r := range runs {
		r.respond(200)
	}
	rollout := map[string]string{}
	for _, sp := range findSpans(s.spans, "gym.rollout") {
		v, _ := attr(sp, "nemo.gym.rollout.id")
		rollout[sp.SpanID.String()] = v.AsString()
	}
	for _, sp := range findSpans(s.spans, "HTTP POST") {
		v, _ := attr(sp, "nemo.gym.rollout.id")
		if got := rollout[sp.Parent.String()]; got == "" || got != v.AsString() {
			t.Errorf("client span rollout %q under parent of rollout %q", v.AsString(), got)
		}
	}
	if st := s.b.Stats(); st.ParentByContext != 2 || st.ParentAmbiguous != 0 {
		t.Errorf("stats %+v", st)
	}
	if len(s.b.ctx) != 0 {
		t.Errorf("%d context bindings left after the requests ended", len(s.b.ctx))
	}
}

// A process whose asyncio context gymtrace cannot read (an unrecognised
// uvloop build): its unresolvable calls say why, and are counted.
func TestNoContextReason(t *testing.T) {
	s := newSim(t, "default")
	g := newGymStack(s, false)
	s.b.SetNoContext(pidAgent, "uvloop_unrecognized")
	r0 := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
	r1 := g.collAgent[1].request(loader.MethodPOST, "/run", withRollout(1, 1, -1))
	g.agentRes[0].request(loader.MethodPOST, "/seed_session").respond(200)
	r0.respond(200)
	r1.respond(200)
	clients := findSpans(s.spans, "HTTP POST")
	if len(clients) != 1 || clients[0].Parent.IsValid() {
		t.Fatalf("want one client span without a parent, got %d", len(clients))
	}
	mustAttr(t, clients[0], "gymtrace.parent.unresolved", "uvloop_unrecognized")
	if st := s.b.Stats(); st.ParentAmbiguous != 1 || st.ParentNoContext != 1 {
		t.Errorf("ParentAmbiguous = %d, ParentNoContext = %d; want 1, 1", st.ParentAmbiguous, st.ParentNoContext)
	}
	if c := s.b.Counts(pidAgent); c.Served != 2 || c.Made != 1 {
		t.Errorf("agent counts %+v, want 2 served, 1 made", c)
	}
}

// The client's REQUEST record can come after the server's whole exchange
// (TestKernelJoinRace saw it once in 2000 on a loaded VM). On a connection
// whose client is traced, the finished server request waits for it and is
// joined; the first request on a connection, with no client seen yet, goes
// out unjoined rather than wait for a client that may not be traced.
func TestClientRecordAfterServerAnswered(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/get_weather").respond(200) // in order: the connection has a traced client
	s.cliLast = true
	c.request(loader.MethodPOST, "/verify").respond(200)
	c.request(loader.MethodPOST, "/get_weather").respond(200)
	s.spans = append(s.spans, s.p.Flush()...)
	joined, servers := serverJoins(s.spans)
	if servers != 3 || joined != 3 {
		t.Errorf("%d of %d server spans joined to their client span, want 3 of 3", joined, servers)
	}
	if st := s.b.Stats(); st.AwaitedClient != 2 || st.JoinedAfterEnd != 2 {
		t.Errorf("awaited %d, joined after the end %d; want 2 and 2", st.AwaitedClient, st.JoinedAfterEnd)
	}
	// A connection with no client seen yet: nothing waits, unless it is a
	// new loopback one (its first request then joins too).
	for _, fresh := range []bool{false, true} {
		s2 := newSim(t, "server,http_client")
		s2.cliLast, s2.midStream = true, !fresh
		var opts []reqOpt
		if fresh {
			opts = append(opts, withFlags(loader.FlagFresh))
		}
		s2.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", opts...).respond(200)
		s2.spans = append(s2.spans, s2.p.Flush()...)
		st := s2.b.Stats()
		if want := map[bool]uint64{false: 0, true: 1}[fresh]; st.AwaitedClient != want || st.JoinedAfterEnd != want {
			t.Errorf("fresh=%v: awaited %d, joined after the end %d; want %d", fresh, st.AwaitedClient, st.JoinedAfterEnd, want)
		}
	}
}

// The kernel bound a call to a request that began after it: no handler can
// have made a call before its request was read, so the binding is wrong and
// the call gets no parent (cause_after_call), never that request's.
func TestCauseAfterCallIsNoParent(t *testing.T) {
	s := newSim(t, "default")
	g := newGymStack(s, false)
	early := s.tick()
	r0 := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
	bound := func(start uint64) reqOpt {
		return func(ev *loader.HTTPEvent) {
			ev.PyCtx = 0x1001
			ev.CauseConn, ev.CauseSeq = g.collAgent[0].srvConn, 0
			if start != 0 {
				ev.StartNs = start
			}
		}
	}
	g.agentRes[0].request(loader.MethodPOST, "/seed_session", bound(0)).respond(200)
	g.agentRes[1].request(loader.MethodPOST, "/seed_session", bound(early)).respond(200)
	r0.respond(200)
	clients := findSpans(s.spans, "HTTP POST")
	if len(clients) != 2 {
		t.Fatalf("%d client spans", len(clients))
	}
	if !clients[0].Parent.IsValid() {
		t.Errorf("a call made during its request got no parent")
	}
	noAttr(t, clients[0], "gymtrace.parent.unresolved")
	if clients[1].Parent.IsValid() {
		t.Errorf("a call bound to a request that began after it got a parent")
	}
	mustAttr(t, clients[1], "gymtrace.parent.unresolved", "cause_after_call")
	if st := s.b.Stats(); st.ParentImpossible != 1 || st.ParentByContext != 1 {
		t.Errorf("ParentImpossible = %d, ParentByContext = %d, want 1 and 1", st.ParentImpossible, st.ParentByContext)
	}
}

// The agent's /run request record came late, at its response (the ring
// buffer had no room when the request ended; loader.GapLate): the call its
// handler made meanwhile came first and named a request not seen yet, so it
// gets no parent, never another request's; the /run SERVER span itself is
// kept, joined to the collector's call, with the rollout's span under it,
// and says it came late.
func TestLateServerRecord(t *testing.T) {
	s := newSim(t, "default")
	s.traced[pidCollector] = true
	g := newGymStack(s, false)
	s.srvLate = true
	run := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
	s.srvLate = false
	other := g.collAgent[1].request(loader.MethodPOST, "/run", withRollout(1, 1, -1))
	bound := func(conn uint64) reqOpt {
		return func(ev *loader.HTTPEvent) { ev.PyCtx, ev.CauseConn, ev.CauseSeq = 0x1001, conn, 0 }
	}
	g.agentRes[0].request(loader.MethodPOST, "/seed_session", bound(g.collAgent[0].srvConn)).respond(200)
	g.agentRes[1].request(loader.MethodPOST, "/seed_session", bound(g.collAgent[1].srvConn)).respond(200)
	run.respond(200)
	other.respond(200)
	s.spans = append(s.spans, s.p.Flush()...) // the /run spans wait for the collector's records

	runs := findSpans(s.spans, "POST /run")
	if len(runs) != 2 {
		t.Fatalf("%d POST /run server spans, want 2 (the late one kept)", len(runs))
	}
	var late, onTime Span
	for _, sp := range runs {
		if v, _ := attr(sp, "gymtrace.record.late"); v.AsString() == "request" {
			late = sp
		} else {
			onTime = sp
		}
	}
	if !late.Parent.IsValid() || !onTime.Parent.IsValid() {
		t.Fatalf("late /run parent %v, on time %v: both want the collector's CLIENT span", late.Parent, onTime.Parent)
	}
	mustAttr(t, late, "gymtrace.connection.gap", true)
	calls := findSpans(s.spans, "HTTP POST")
	var seeds []Span
	for _, c := range calls {
		if v, _ := attr(c, "url.full"); strings.HasSuffix(v.AsString(), "/seed_session") {
			seeds = append(seeds, c)
		}
	}
	if len(seeds) != 2 {
		t.Fatalf("%d /seed_session CLIENT spans, want 2", len(seeds))
	}
	// Nothing under the late /run, nor under its gym.rollout.
	underLate := map[trace.SpanID]bool{late.SpanID: true}
	for _, sp := range findSpans(s.spans, "gym.rollout") {
		if sp.Parent == late.SpanID {
			underLate[sp.SpanID] = true
		}
	}
	for _, c := range seeds {
		switch {
		case underLate[c.Parent]:
			t.Errorf("a call made before its request's late record came is under it")
		case !c.Parent.IsValid():
			mustAttr(t, c, "gymtrace.parent.unresolved", "request_not_traced")
		}
	}
	n := 0
	for _, c := range seeds {
		if c.Parent.IsValid() {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d of the two calls parented, want 1 (the on-time request's)", n)
	}
	if len(findSpans(s.spans, "gym.rollout")) != 2 {
		t.Errorf("%d gym.rollout spans, want 2 (the late /run's too)", len(findSpans(s.spans, "gym.rollout")))
	}
}
