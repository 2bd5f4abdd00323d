//go:build linux

package spans

import (
	"testing"
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// genai feeds the kernel's GenAI record for the model server's side of k,
// as the kernel emits it: before the response record.
func (k *call) genai(req, resp string, in, out uint32) {
	ev := loader.GenAIEvent{Kind: loader.EvGenAI, Dialect: loader.DialectResponses, ConnId: k.c.srvConn, Seq: k.seq,
		Have:        loader.GenAIReqModel | loader.GenAIRespModel | loader.GenAIInput | loader.GenAIOutput,
		InputTokens: in, OutputTokens: out}
	ev.ReqModelLen = uint16(copy(ev.ReqModel[:], req))
	ev.RespModelLen = uint16(copy(ev.RespModel[:], resp))
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.GenAIEventSize)
	if _, err := k.c.s.p.Process(raw); err != nil {
		k.c.s.t.Fatal(err)
	}
}

// genaiRollout is gymStack.rollout with the model calls' GenAI records;
// counts[j] < 0 gives call j none.
func (g *gymStack) genaiRollout(i int, counts [][2]int) {
	run := g.collAgent[i].request(loader.MethodPOST, "/run", withRollout(1, int32(i), -1))
	resp := g.agentSelf[i].request(loader.MethodPOST, "/v1/responses")
	for _, c := range counts {
		k := g.agentMod[i].request(loader.MethodPOST, "/v1/responses")
		if c[0] >= 0 {
			k.genai("m", "m-2", uint32(c[0]), uint32(c[1]))
		}
		k.respond(200)
		g.agentRes[i].request(loader.MethodPOST, "/get_weather").respond(200)
	}
	resp.respond(200)
	run.respond(200)
}

func spanNamed(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func TestGenAIAttributesAndRolloutTotals(t *testing.T) {
	for _, spec := range []string{"per_rollout", "default"} {
		t.Run(spec, func(t *testing.T) {
			s := newSim(t, spec)
			g := newGymStack(s, false)
			g.genaiRollout(0, [][2]int{{100, 7}, {250, 9}})
			g.genaiRollout(1, [][2]int{{100, 7}, {-1, 0}}) // one call's counts not read
			var calls []Span
			if spec == "per_rollout" {
				calls = spanNamed(s.spans, "gym.model.responses")
			} else {
				for _, sp := range s.spans {
					if sp.Proc != nil && sp.Proc.PID == pidModel && sp.Name == "POST /v1/responses" {
						calls = append(calls, sp)
					}
				}
			}
			if len(calls) != 4 {
				t.Fatalf("%d model call spans, want 4", len(calls))
			}
			read := 0
			for _, c := range calls {
				if v, ok := attr(c, "gen_ai.usage.input_tokens"); ok {
					read++
					if m, _ := attr(c, "gen_ai.response.model"); m.AsString() != "m-2" || v.AsInt64() <= 0 {
						t.Errorf("call %v", c.Attrs)
					}
					if p, _ := attr(c, "gen_ai.provider.name"); p.AsString() != "openai" {
						t.Errorf("provider %v", p)
					}
				}
			}
			if read != 3 {
				t.Errorf("%d calls with their tokens, want 3", read)
			}
			ro := spanNamed(s.spans, "gym.rollout")
			if len(ro) != 2 {
				t.Fatalf("%d gym.rollout spans", len(ro))
			}
			for _, r := range ro {
				id, _ := attr(r, "nemo.gym.rollout.id")
				n, _ := attr(r, "nemo.gym.rollout.model_calls")
				in, hasIn := attr(r, "nemo.gym.rollout.input_tokens")
				out, hasOut := attr(r, "nemo.gym.rollout.output_tokens")
				switch id.AsString() {
				case "1-0":
					if n.AsInt64() != 2 || !hasIn || in.AsInt64() != 350 || !hasOut || out.AsInt64() != 16 {
						t.Errorf("rollout 1-0: %v", r.Attrs)
					}
					if m := r.Measures.Rollout; m == nil || m.ModelCalls != 2 || len(m.TurnGapsMs) != 1 || !m.HasInput {
						t.Errorf("rollout 1-0 measures %+v", m)
					}
				case "1-1":
					if n.AsInt64() != 2 || hasIn || hasOut {
						t.Errorf("rollout 1-1 with a call unread has sums: %v", r.Attrs)
					}
				default:
					t.Errorf("rollout id %q", id.AsString())
				}
			}
		})
	}
}

// A model call the agent made whose model server side is not seen (its
// records lost): the rollout's sums would be short, so there are none.
func TestRolloutTotalsNeedEveryCallMade(t *testing.T) {
	s := newSim(t, "per_rollout")
	g := newGymStack(s, false)
	run := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
	resp := g.agentSelf[0].request(loader.MethodPOST, "/v1/responses")
	k := g.agentMod[0].request(loader.MethodPOST, "/v1/responses")
	k.genai("m", "m-2", 10, 1)
	k.respond(200)
	s.traced[pidModel] = false // the second call's server side goes unseen
	g.agentMod[0].request(loader.MethodPOST, "/v1/responses").respond(200)
	s.traced[pidModel] = true
	resp.respond(200)
	run.respond(200)
	ro := spanNamed(s.spans, "gym.rollout")
	if len(ro) != 1 {
		t.Fatalf("%d gym.rollout spans", len(ro))
	}
	n, _ := attr(ro[0], "nemo.gym.rollout.model_calls")
	if _, has := attr(ro[0], "nemo.gym.rollout.input_tokens"); has || n.AsInt64() != 2 {
		t.Errorf("rollout with a call unseen: %v", ro[0].Attrs)
	}
}

// genaiClient feeds the kernel's GenAI record for the client side of k (a
// model server's call upstream), before the response record.
func (k *call) genaiClient(dialect uint8, req, resp string, in, out uint32) {
	ev := loader.GenAIEvent{Kind: loader.EvGenAI, Dialect: dialect, ConnId: k.c.cliConn, Seq: k.seq,
		Have:        loader.GenAIReqModel | loader.GenAIRespModel | loader.GenAIInput | loader.GenAIOutput,
		InputTokens: in, OutputTokens: out}
	ev.ReqModelLen = uint16(copy(ev.ReqModel[:], req))
	ev.RespModelLen = uint16(copy(ev.RespModel[:], resp))
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.GenAIEventSize)
	if _, err := k.c.s.p.Process(raw); err != nil {
		k.c.s.t.Fatal(err)
	}
}

// A model server's calls upstream (to an untraced vLLM) carry their own
// GenAI values on their CLIENT spans, marked upstream, and add nothing to
// the rollout: its calls and sums are the model server's SERVER exchanges',
// and Gym's metrics get no GenAI measures from them.
func TestUpstreamModelCallsNotCounted(t *testing.T) {
	for _, spec := range []string{"per_rollout", "default"} {
		t.Run(spec, func(t *testing.T) {
			s := newSim(t, spec)
			g := newGymStack(s, false)
			const pidUpstream = 500 // not traced
			up := s.dial(pidModel, pidUpstream, "10.0.0.9:8000")
			run := g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(1, 0, -1))
			resp := g.agentSelf[0].request(loader.MethodPOST, "/v1/responses")
			for j, c := range [][2]uint32{{100, 7}, {250, 9}} {
				k := g.agentMod[0].request(loader.MethodPOST, "/v1/chat/completions")
				u := up.request(loader.MethodPOST, "/ng-rollout/1-0/v1/messages")
				u.genaiClient(loader.DialectMessages, "up", "up-r", 5000+uint32(j), 600)
				u.respond(200)
				k.genai("m", "m-2", c[0], c[1])
				k.respond(200)
			}
			resp.respond(200)
			run.respond(200)
			var ups int
			for _, sp := range s.spans {
				if sp.Proc == nil || sp.Proc.PID != pidModel || sp.Name != "HTTP POST" {
					continue
				}
				ups++
				mustAttr(t, sp, "nemo.gym.model.upstream", true)
				mustAttr(t, sp, "gen_ai.operation.name", "chat")
				mustAttr(t, sp, "gen_ai.provider.name", "anthropic")
				mustAttr(t, sp, "gen_ai.request.model", "up")
				mustAttr(t, sp, "gen_ai.response.model", "up-r")
				mustAttr(t, sp, "gen_ai.usage.output_tokens", int64(600))
				if v, _ := attr(sp, "gen_ai.usage.input_tokens"); v.AsInt64() < 5000 {
					t.Errorf("upstream input tokens %v", sp.Attrs)
				}
				if sp.Measures.GenAI != nil {
					t.Errorf("an upstream call with GenAI measures: %+v", sp.Measures.GenAI)
				}
			}
			if ups != 2 {
				t.Errorf("%d upstream CLIENT spans, want 2", ups)
			}
			for _, sp := range s.spans {
				if sp.Name == "HTTP POST" && sp.Proc != nil && sp.Proc.PID == pidAgent {
					noAttr(t, sp, "nemo.gym.model.upstream")
					noAttr(t, sp, "gen_ai.request.model")
				}
			}
			ro := spanNamed(s.spans, "gym.rollout")
			if len(ro) != 1 {
				t.Fatalf("%d gym.rollout spans", len(ro))
			}
			mustAttr(t, ro[0], "nemo.gym.rollout.model_calls", int64(2))
			mustAttr(t, ro[0], "nemo.gym.rollout.input_tokens", int64(350))
			mustAttr(t, ro[0], "nemo.gym.rollout.output_tokens", int64(16))
			if m := ro[0].Measures.Rollout; m == nil || m.ModelCalls != 2 || m.InputTokens != 350 || len(m.TurnGapsMs) != 1 {
				t.Errorf("rollout measures %+v", m)
			}
		})
	}
}
