//go:build linux

package spans

import (
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Span names as desc() renders them.
const (
	aRun      = "simple_agent:POST /run"
	aRollout  = "simple_agent:gym.rollout"
	aResp     = "simple_agent:POST /v1/responses"
	aAgent    = "simple_agent:gym.agent.responses"
	cSeed     = "simple_agent:HTTP POST ->resources/seed_session"
	cSelf     = "simple_agent:HTTP POST ->agent/v1/responses"
	cModel    = "simple_agent:HTTP POST ->model/v1/responses"
	cWeather  = "simple_agent:HTTP POST ->resources/get_weather"
	cVerify   = "simple_agent:HTTP POST ->resources/verify"
	mResp     = "policy_model:POST /v1/responses"
	mGym      = "policy_model:gym.model.responses"
	rSeed     = "weather:POST /seed_session"
	rWeather  = "weather:POST /get_weather"
	rVerify   = "weather:POST /verify"
	rGym      = "weather:gym.verify"
	rootEdge  = " <- ROOT"
	childEdge = " <- "
)

func e(child, parent string) string {
	if parent == "" {
		return child + rootEdge
	}
	return child + childEdge + parent
}

var rolloutTrees = map[string][]string{
	"per_rollout": {
		e(aRun, ""), e(aRollout, aRun),
		e(cSeed, aRollout), e(rSeed, cSeed),
		e(cSelf, aRollout), e(aResp, cSelf), e(aAgent, aResp),
		e(cModel, aAgent), e(mResp, cModel), e(mGym, mResp),
		e(cWeather, aAgent), e(rWeather, cWeather),
		e(cModel, aAgent), e(mResp, cModel), e(mGym, mResp),
		e(cVerify, aRollout), e(rVerify, cVerify), e(rGym, rVerify),
	},
	"default": {
		e(aRun, ""), e(aRollout, aRun),
		e(cSeed, aRollout), e(rSeed, cSeed),
		e(cSelf, aRollout), e(aResp, cSelf),
		e(cModel, aResp), e(mResp, cModel),
		e(cWeather, aResp), e(rWeather, cWeather),
		e(cModel, aResp), e(mResp, cModel),
		e(cVerify, aRollout), e(rVerify, cVerify),
	},
	"server,http_client,verify": {
		e(aRun, ""),
		e(cSeed, aRun), e(rSeed, cSeed),
		e(cSelf, aRun), e(aResp, cSelf),
		e(cModel, aResp), e(mResp, cModel),
		e(cWeather, aResp), e(rWeather, cWeather),
		e(cModel, aResp), e(mResp, cModel),
		e(cVerify, aRun), e(rVerify, cVerify), e(rGym, rVerify),
	},
	"verify": {e(rGym, "")},
	"":       nil,
	// Without server, each gym.* span is a root and what its handler calls
	// hangs under it; the other processes' spans are disconnected.
	"http_client,rollout,verify,model_call": {
		e(aRollout, ""),
		e(cSeed, aRollout), e(cSelf, aRollout),
		// /v1/responses (agent group, off) is gated in the kernel, so the
		// nested calls see only /run in flight.
		e(cModel, aRollout), e(cWeather, aRollout), e(cModel, aRollout),
		e(cVerify, aRollout),
		e("policy_model:gym.model.responses", ""), e("policy_model:gym.model.responses", ""),
		e(rGym, ""),
	},
}

func TestGymRolloutBySelection(t *testing.T) {
	for spec, tree := range rolloutTrees {
		for _, noGate := range []bool{false, true} {
			name := spec
			if name == "" {
				name = "all-off"
			}
			if noGate {
				name += "/no-gate"
			}
			t.Run(name, func(t *testing.T) {
				if noGate && spec == "http_client,rollout,verify,model_call" {
					t.Skip("without the kernel gate /v1/responses is in flight and nests the calls; covered gated")
				}
				s := newSim(t, spec)
				s.noGate = noGate
				g := newGymStack(s, false)
				const rollouts = 3
				var want []string
				for i := 0; i < rollouts; i++ {
					g.rollout(0, 7, int32(i))
					want = append(want, tree...)
				}
				diffEdges(t, edges(t, s.spans), want)
				wantTraces := 0
				if len(tree) > 0 {
					// One trace per root span.
					wantTraces = rollouts * strings.Count(strings.Join(tree, "\n"), rootEdge)
				}
				if got := traces(s.spans); got != wantTraces {
					t.Errorf("%d traces, want %d", got, wantTraces)
				}
				checkKinds(t, s.spans)
				st := s.p.Stats()
				if st.Builder.ParentAmbiguous != 0 {
					t.Errorf("ambiguous parents at concurrency 1: %d", st.Builder.ParentAmbiguous)
				}
				if st.Builder.OpenServer+st.Builder.OpenClient+st.Builder.JoinQueue != 0 || st.Assembler.OpenConns != 0 {
					t.Errorf("state left after every exchange ended: %+v", st)
				}
				var total uint64
				for _, n := range st.Builder.Spans {
					total += n
				}
				if total != uint64(len(s.spans)) {
					t.Errorf("Stats.Spans counts %d, returned %d", total, len(s.spans))
				}
			})
		}
	}
}

func checkKinds(t *testing.T, spans []Span) {
	t.Helper()
	for _, sp := range spans {
		var want trace.SpanKind
		var group string
		switch {
		case strings.HasPrefix(sp.Name, "HTTP "):
			want, group = trace.SpanKindClient, "http_client"
		case strings.HasPrefix(sp.Name, "gym."):
			want = trace.SpanKindInternal
		default:
			want, group = trace.SpanKindServer, "server"
		}
		if sp.Kind != want {
			t.Errorf("%s: kind %v, want %v", desc(sp), sp.Kind, want)
		}
		if group != "" && sp.Group != group {
			t.Errorf("%s: group %q, want %q", desc(sp), sp.Group, group)
		}
		if !sp.End.After(sp.Start) {
			t.Errorf("%s: ends at or before its start", desc(sp))
		}
		if !sp.Sampled || !sp.TraceID.IsValid() || !sp.SpanID.IsValid() {
			t.Errorf("%s: bad ids or unsampled", desc(sp))
		}
	}
}

func TestGymRolloutAttributes(t *testing.T) {
	s := newSim(t, "per_rollout")
	g := newGymStack(s, false)
	g.rollout(0, 7, 2)
	for _, sp := range s.spans {
		switch {
		case strings.HasPrefix(sp.Name, "gym."):
			mustAttr(t, sp, "nemo.gym.rollout.id", "7-2")
			mustAttr(t, sp, "nemo.gym.server.name", sp.Proc.ServerName)
			if sp.Name == "gym.rollout" && sp.Group != "rollout" || sp.Name == "gym.verify" && sp.Group != "verify" ||
				sp.Name == "gym.model.responses" && sp.Group != "model_call" || sp.Name == "gym.agent.responses" && sp.Group != "agent" {
				t.Errorf("%s in group %s", sp.Name, sp.Group)
			}
		case sp.Kind == trace.SpanKindClient:
			mustAttr(t, sp, "http.request.method", "POST")
			mustAttr(t, sp, "http.response.status_code", 200)
			mustAttr(t, sp, "nemo.gym.rollout.id", "7-2")
			mustAttr(t, sp, "server.address", "127.0.0.1")
			if v, _ := attr(sp, "network.local.port"); v.AsInt64() < 40000 {
				t.Errorf("%s: network.local.port %v", desc(sp), v.v)
			}
		case sp.Kind == trace.SpanKindServer:
			mustAttr(t, sp, "http.request.method", "POST")
			mustAttr(t, sp, "http.response.status_code", 200)
			mustAttr(t, sp, "server.address", "127.0.0.1")
			mustAttr(t, sp, "client.address", "127.0.0.1")
			mustAttr(t, sp, "nemo.gym.server.name", sp.Proc.ServerName)
			mustAttr(t, sp, "nemo.gym.rollout.id", "7-2")
			mustAttr(t, sp, "url.path", strings.SplitN(sp.Name, " ", 2)[1])
			mustAttr(t, sp, "http.route", strings.SplitN(sp.Name, " ", 2)[1])
		}
		if sp.Status != codes.Unset {
			t.Errorf("%s: status %v", desc(sp), sp.Status)
		}
	}
	verify := findSpans(s.spans, "HTTP POST")
	var found bool
	for _, sp := range verify {
		if v, _ := attr(sp, "url.full"); v.AsString() == "http://127.0.0.1:8003/verify" {
			found = true
			mustAttr(t, sp, "server.port", 8003)
		}
	}
	if !found {
		t.Error("no client span with url.full http://127.0.0.1:8003/verify")
	}
	run := findSpans(s.spans, "POST /run")[0]
	mustAttr(t, run, "server.port", 8001)
}

func TestIPv6Rollout(t *testing.T) {
	s := newSim(t, "per_rollout")
	g := newGymStack(s, true)
	g.rollout(1, 0, 0)
	diffEdges(t, edges(t, s.spans), rolloutTrees["per_rollout"])
	if traces(s.spans) != 1 {
		t.Errorf("%d traces, want 1", traces(s.spans))
	}
	for _, sp := range s.spans {
		switch sp.Kind {
		case trace.SpanKindServer:
			mustAttr(t, sp, "server.address", "::1")
			mustAttr(t, sp, "client.address", "::1")
		case trace.SpanKindClient:
			mustAttr(t, sp, "server.address", "::1")
			if v, _ := attr(sp, "url.full"); !strings.HasPrefix(v.AsString(), "http://[::1]:800") {
				t.Errorf("url.full %q", v.AsString())
			}
		}
	}
}

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
// is by order and holds; on one picked up mid-stream the timing guard still
// refuses a client that "started" after the request was read.
func TestJoinWhenTheWriterReturnsLate(t *testing.T) {
	for _, fresh := range []bool{true, false} {
		s := newSim(t, "server,http_client")
		s.lateCli, s.cliLag = true, uint64(20*time.Millisecond)
		c := s.dial(pidAgent, pidResources, resAddr)
		var opts []reqOpt
		if fresh {
			opts = append(opts, withFlags(loader.FlagFresh))
		}
		c.request(loader.MethodPOST, "/get_weather", opts...).respond(200)
		c.request(loader.MethodPOST, "/verify", opts...).respond(200)
		joined := 0
		for _, sp := range s.spans {
			if sp.Kind == trace.SpanKindServer {
				if p := findByID(s.spans, sp.Parent); p != nil && p.Kind == trace.SpanKindClient {
					joined++
				}
			}
		}
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

func TestCloseWithPendingAndStatusRules(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/boom").respond(500)
	c.request(loader.MethodPOST, "/slow")
	c.closeSide(pidResources, false)
	c.closeSide(pidAgent, true)

	byDesc := map[string]Span{}
	for _, sp := range s.spans {
		byDesc[desc(sp)] = sp
	}
	check := func(d string, want codes.Code, errType string) {
		t.Helper()
		sp, ok := byDesc[d]
		if !ok {
			t.Fatalf("no span %s in %v", d, edges(t, s.spans))
		}
		if sp.Status != want {
			t.Errorf("%s: status %v, want %v", d, sp.Status, want)
		}
		if errType == "" {
			noAttr(t, sp, "error.type")
		} else {
			mustAttr(t, sp, "error.type", errType)
		}
	}
	// A 5xx is ERROR on the server span and not on the client span.
	check("weather:POST /boom", codes.Error, "500")
	check("simple_agent:HTTP POST ->resources/boom", codes.Unset, "")
	// No response at all: a connection error on both ends.
	check("weather:POST /slow", codes.Error, "connection_closed")
	check("simple_agent:HTTP POST ->resources/slow", codes.Error, "connection_reset")
	noAttr(t, byDesc["weather:POST /slow"], "http.response.status_code")
	if st := s.p.Stats().Assembler; st.Failed != 2 || st.OpenConns != 0 {
		t.Errorf("assembler stats %+v", st)
	}
}

func TestResetMidResponseIsClientError(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/x").respondFlags(200, 0, loader.FlagConnError)
	for _, sp := range s.spans {
		if sp.Kind == trace.SpanKindClient && sp.Status != codes.Error {
			t.Errorf("client span of a reset response: %v", sp.Status)
		}
		if sp.Kind == trace.SpanKindServer && sp.Status != codes.Unset {
			t.Errorf("server span whose response was written: %v", sp.Status)
		}
	}
}

const tpSampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
const tpUnsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"

func TestTraceparentHonoured(t *testing.T) {
	// The collector is untraced; its request carries a traceparent (Gym's
	// own telemetry, or another node's gymtrace).
	for _, spec := range []string{"per_rollout", "rollout,http_client"} {
		t.Run(spec, func(t *testing.T) {
			s := newSim(t, spec)
			c := s.dial(pidCollector, pidAgent, agentAddr)
			run := c.request(loader.MethodPOST, "/run", withTraceparent(tpSampled))
			s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/seed_session").respond(200)
			run.respond(200)
			want, _ := ParseTraceparent(tpSampled)
			for _, sp := range s.spans {
				if sp.TraceID != want.TraceID() {
					t.Errorf("%s: trace %v, want the traceparent's", desc(sp), sp.TraceID)
				}
			}
			top := findSpans(s.spans, "POST /run")
			if spec != "per_rollout" {
				top = findSpans(s.spans, "gym.rollout") // with server off it takes the server span's place
			}
			if len(top) != 1 || top[0].Parent != want.SpanID() {
				t.Fatalf("top span's parent is not the traceparent's span id: %v", top)
			}
			if st := s.b.Stats(); st.JoinedTraceparent != 1 {
				t.Errorf("JoinedTraceparent = %d", st.JoinedTraceparent)
			}
		})
	}
}

// An in-band traceparent wins over the same-node connection join.
func TestTraceparentBeatsTupleJoin(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/x", withTraceparent(tpSampled)).respond(200)
	want, _ := ParseTraceparent(tpSampled)
	for _, sp := range s.spans {
		if sp.TraceID != want.TraceID() || sp.Parent != want.SpanID() {
			t.Errorf("%s: trace %v parent %v; want the header's", desc(sp), sp.TraceID, sp.Parent)
		}
	}
	if st := s.b.Stats(); st.OwnTraceparent != 1 || st.JoinedTraceparent != 1 || st.JoinedTuple != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestUnsampledTraceparentRespected(t *testing.T) {
	s := newSim(t, "per_rollout")
	c := s.dial(pidCollector, pidAgent, agentAddr)
	run := c.request(loader.MethodPOST, "/run", withTraceparent(tpUnsampled))
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify").respond(200)
	run.respond(200)
	if len(s.spans) != 0 {
		t.Fatalf("an unsampled incoming trace produced %d spans: %v", len(s.spans), edges(t, s.spans))
	}
	if st := s.b.Stats(); st.Unsampled != 5 {
		t.Errorf("Unsampled = %d, want 5", st.Unsampled)
	}
}

func TestBadTraceparentIgnored(t *testing.T) {
	s := newSim(t, "server")
	c := s.dial(pidCollector, pidAgent, agentAddr)
	c.request(loader.MethodPOST, "/run", withTraceparent(strings.ToUpper(tpSampled))).respond(200)
	if len(s.spans) != 1 || s.spans[0].Parent.IsValid() {
		t.Fatalf("spans %v", edges(t, s.spans))
	}
	if s.b.Stats().BadTraceparent != 1 {
		t.Error("bad traceparent not counted")
	}
}

func TestSamplerRatio(t *testing.T) {
	s := newSim(t, "default")
	s.b.opt.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))
	g := newGymStack(s, false)
	g.rollout(0, 1, 1)
	if len(s.spans) != 0 {
		t.Fatalf("ratio 0 exported %d spans", len(s.spans))
	}
	s2 := newSim(t, "default")
	s2.b.opt.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(1))
	newGymStack(s2, false).rollout(0, 1, 1)
	if len(s2.spans) != len(rolloutTrees["default"]) {
		t.Fatalf("ratio 1 exported %d spans, want %d", len(s2.spans), len(rolloutTrees["default"]))
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

func TestRolloutPrefix(t *testing.T) {
	s := newSim(t, "per_rollout")
	self := s.dial(pidAgent, pidAgent, agentAddr)
	mod := s.dial(pidAgent, pidModel, modelAddr)
	res := s.dial(pidAgent, pidResources, resAddr)
	outer := self.request(loader.MethodPOST, "/ng-rollout/ro-9/v1/responses")
	mod.request(loader.MethodPOST, "/ng-rollout/ro-9/v1/chat/completions").respond(200)
	res.request(loader.MethodPOST, "/ng-rollout/ro-9/get_weather").respond(200)
	outer.respond(200)
	cap := s.dial(pidAgent, pidAgent, agentAddr)
	cap.request(loader.MethodPOST, "/ng-rollout/ro-9/training-token-capture/v1/responses").respond(200)

	want := map[string]string{
		"POST /ng-rollout/{rollout_id}/v1/responses":                        "server",
		"POST /v1/chat/completions":                                         "server",
		"POST /get_weather":                                                 "server",
		"POST /ng-rollout/{rollout_id}/training-token-capture/v1/responses": "server",
		"gym.agent.responses":                                               "agent",
		"gym.model.chat_completions":                                        "model_call",
	}
	names := map[string]int{}
	for _, sp := range s.spans {
		names[sp.Name]++
		if g, ok := want[sp.Name]; ok && sp.Group != g {
			t.Errorf("%s in group %s, want %s", sp.Name, sp.Group, g)
		}
		mustAttr(t, sp, "nemo.gym.rollout.id", "ro-9")
		if sp.Kind == trace.SpanKindServer {
			if v, _ := attr(sp, "url.path"); !strings.HasPrefix(v.AsString(), "/ng-rollout/ro-9/") {
				t.Errorf("%s: url.path %q lost the prefix", sp.Name, v.AsString())
			}
		}
	}
	for n := range want {
		if names[n] == 0 {
			t.Errorf("no span %q; got %v", n, names)
		}
	}
	if names["gym.agent.responses"] != 2 {
		t.Errorf("gym.agent.responses x%d, want 2", names["gym.agent.responses"])
	}
}

// Without discovery, a process's role is inferred from what it serves. A
// route shared by several kinds waits for the role: the model's first
// /v1/responses is held and gets its gym.* span when the role is known.
func TestRoleInference(t *testing.T) {
	s := newSim(t, "per_rollout")
	s.procs = map[uint32]*discover.Process{} // discovery knows nothing
	m := s.dial(pidAgent, pidModel, modelAddr)
	m.request(loader.MethodPOST, "/v1/responses").respond(200) // model or agent? unknown
	a := s.dial(pidCollector, pidAgent, agentAddr)
	a.request(loader.MethodPOST, "/run").respond(200) // an agent
	s.dial(pidAgent, pidAgent, agentAddr).request(loader.MethodPOST, "/v1/responses").respond(200)
	m.request(loader.MethodPOST, "/v1/chat/completions").respond(200) // a model
	m.request(loader.MethodPOST, "/v1/responses").respond(200)

	var gyms []string
	for _, sp := range s.spans {
		if strings.HasPrefix(sp.Name, "gym.") {
			gyms = append(gyms, sp.Name)
		}
	}
	want := "gym.rollout,gym.agent.responses,gym.model.responses,gym.model.chat_completions,gym.model.responses"
	if strings.Join(gyms, ",") != want {
		t.Errorf("gym spans %v, want %s", gyms, want)
	}
	if st := s.b.Stats(); st.GymSpanUnresolved != 0 || st.Held == 0 {
		t.Errorf("GymSpanUnresolved = %d, want 0; held %d, want some", st.GymSpanUnresolved, st.Held)
	}
	if s.b.InferredRole(pidAgent) != groups.RoleAgent || s.b.InferredRole(pidModel) != groups.RoleModel {
		t.Error("roles not inferred")
	}
}

func TestFlushTruncates(t *testing.T) {
	s := newSim(t, "per_rollout")
	g := newGymStack(s, false)
	g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(2, 0, -1))
	g.agentMod[0].request(loader.MethodPOST, "/v1/responses")
	if len(s.spans) != 0 {
		t.Fatal("spans before anything ended")
	}
	out := s.p.Flush()
	diffEdges(t, edges(t, out), []string{
		e(aRun, ""), e(aRollout, aRun),
		e("simple_agent:HTTP POST ->model/v1/responses", aRollout),
		e(mResp, "simple_agent:HTTP POST ->model/v1/responses"),
		e(mGym, mResp),
	})
	for _, sp := range out {
		mustAttr(t, sp, "nemo.span.truncated", true)
		if sp.Status != codes.Unset {
			t.Errorf("%s: truncated span has status %v", desc(sp), sp.Status)
		}
	}
	if st := s.p.Stats(); st.Builder.OpenServer+st.Builder.OpenClient != 0 || st.Assembler.OpenConns != 0 {
		t.Errorf("state after Flush: %+v", st)
	}
	if len(s.p.Flush()) != 0 {
		t.Error("second Flush returned spans")
	}
}

func TestSetMaskAtRunTime(t *testing.T) {
	s := newSim(t, "server")
	s.noGate = true
	c := s.dial(pidCollector, pidAgent, agentAddr)
	c.request(loader.MethodPOST, "/run").respond(200)
	s.b.SetMask(groups.MaskOf(groups.Rollout))
	c.request(loader.MethodPOST, "/run").respond(200)
	got := edges(t, s.spans)
	diffEdges(t, got, []string{e(aRun, ""), e(aRollout, "")})
}

func TestParseTraceparent(t *testing.T) {
	good := []string{
		tpSampled,
		tpUnsampled,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
		"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
	}
	for _, s := range good {
		sc, ok := ParseTraceparent(s)
		if !ok || !sc.IsRemote() || !sc.IsValid() {
			t.Errorf("%q rejected", s)
		}
	}
	if sc, _ := ParseTraceparent(tpSampled); !sc.IsSampled() || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("parsed %v", sc)
	}
	bad := []string{
		"",
		tpSampled[:54],
		tpSampled + "-",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
	}
	for _, s := range bad {
		if _, ok := ParseTraceparent(s); ok {
			t.Errorf("%q accepted", s)
		}
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	if FormatTraceparent(tid, sid, true) != tpSampled || FormatTraceparent(tid, sid, false) != tpUnsampled {
		t.Error("FormatTraceparent does not round-trip")
	}
}

func FuzzParseTraceparent(f *testing.F) {
	f.Add(tpSampled)
	f.Add("00-")
	f.Fuzz(func(t *testing.T, s string) {
		sc, ok := ParseTraceparent(s)
		if !ok {
			return
		}
		if !sc.IsValid() {
			t.Fatal("accepted an invalid span context")
		}
		// Only the sampled flag is kept; version 00 ids must round-trip.
		if s[:2] == "00" && FormatTraceparent(sc.TraceID(), sc.SpanID(), sc.IsSampled())[:53] != s[:53] {
			t.Fatalf("%q does not round-trip", s)
		}
	})
}

func TestServerAuthority(t *testing.T) {
	cases := []struct{ host, remote, wantHost, wantFull string }{
		{"127.0.0.1:8003", "127.0.0.1:8003", "127.0.0.1", "http://127.0.0.1:8003/p"},
		{"model.local:9000", "10.0.0.2:9000", "model.local", "http://model.local:9000/p"},
		{"[::1]:8002", "[::1]:8002", "::1", "http://[::1]:8002/p"},
		{"", "[::1]:8002", "::1", "http://[::1]:8002/p"},
		{"evil/x@y", "10.0.0.2:80", "10.0.0.2", "http://10.0.0.2:80/p"},
		{"example.com", "10.0.0.2:80", "example.com", "http://example.com/p"},
	}
	for _, c := range cases {
		s := newSim(t, "http_client")
		s.traced[pidModel] = false
		conn := s.dial(pidAgent, pidModel, c.remote)
		conn.host = c.host
		conn.request(loader.MethodPOST, "/p").respond(200)
		sp := s.spans[0]
		mustAttr(t, sp, "server.address", c.wantHost)
		mustAttr(t, sp, "url.full", c.wantFull)
	}
}

func TestExpireEndsStaleExchangesAsTruncated(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.p = NewPipeline(http.NewAssembler(http.AssemblerOptions{MaxAge: time.Millisecond}), s.b)
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/hang")
	out := s.p.Expire(s.now + uint64(time.Second))
	if len(out) != 2 {
		t.Fatalf("Expire returned %d spans, want client and server", len(out))
	}
	for _, sp := range out {
		mustAttr(t, sp, "nemo.span.truncated", true)
	}
	if st := s.p.Stats(); st.Assembler.Evicted != 2 || st.Builder.Truncated != 2 || st.Builder.OpenServer+st.Builder.OpenClient != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPipelineCountsDecodeErrors(t *testing.T) {
	s := newSim(t, "default")
	if _, err := s.p.Process([]byte{1, 2, 3}); err == nil {
		t.Fatal("a 3-byte record decoded")
	}
	if s.p.Stats().DecodeErrors != 1 {
		t.Error("decode error not counted")
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
