//go:build linux

package spans

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
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
	s.midStream = true                                // no join wait: the collector is not traced
	a.request(loader.MethodPOST, "/run").respond(200) // an agent
	s.midStream = false
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
