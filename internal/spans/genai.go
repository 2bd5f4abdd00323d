//go:build linux

package spans

import (
	"slices"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
)

// GenAI attributes of model calls, and each rollout's totals (docs/metrics.md):
// the model names and token counts the kernel read from a model server's
// exchanges (http.GenAI) go on the call's gym.model.* span (its SERVER span
// when model_call is off), and add up on the gym.rollout span of the /run
// whose handler made the call. Only the model server's SERVER exchanges add
// up, so each token is counted once: its own CLIENT calls upstream (vLLM, an
// OpenAI endpoint) get the same attributes on their CLIENT spans (finish.go,
// with nemo.gym.model.upstream) and are neither calls made nor calls counted.

// rolloutSum is what a rollout's model calls add up to (on its /run inbound).
type rolloutSum struct {
	calls           int
	input, output   int
	inMiss, outMiss int      // calls whose count the kernel did not read
	starts          []uint64 // the calls' request starts (kernel ns), for the turn gaps
	// made: the model calls the rollout's handlers made, as their CLIENT
	// exchanges say; a sum over fewer answered calls than that is short.
	made int
}

// whole: every model call the rollout made was answered and counted.
func (s *rolloutSum) whole() bool { return s.made == s.calls }

// genaiAttrs are the OTel GenAI attributes of one model call.
//
// gen_ai.provider.name: the server speaks a provider's API, and the dialect
// says whose: "openai" for chat completions and the responses API, which
// OpenAI-compatible servers (vLLM, SGLang, NIM, OpenAI itself) serve,
// "anthropic" for messages. gen_ai.operation.name is "chat" for all three.
func genaiAttrs(attrs []attribute.KeyValue, g *http.GenAI) []attribute.KeyValue {
	attrs = append(attrs,
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", Provider(g.Dialect)))
	if g.ReqModel != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", g.ReqModel))
	}
	if g.RespModel != "" {
		attrs = append(attrs, attribute.String("gen_ai.response.model", g.RespModel))
	}
	if g.HasInput {
		attrs = append(attrs, attribute.Int("gen_ai.usage.input_tokens", g.Input))
	}
	if g.HasOutput {
		attrs = append(attrs, attribute.Int("gen_ai.usage.output_tokens", g.Output))
	}
	return attrs
}

// Provider is gen_ai.provider.name for a dialect (genaiAttrs).
func Provider(dialect string) string {
	if dialect == http.DialectMessages {
		return "anthropic"
	}
	return "openai"
}

// isModelCall: a model server's gym.model.* route, whether or not
// model_call is enabled.
func isModelCall(in *inbound) bool {
	return in.ri.gymSpan != "" && in.ri.gymGroup == groups.ModelCall
}

// rolloutOf is the /run inbound on this node whose handler, through the
// calls between (the agent's own /v1/responses among them), made in; nil
// when the chain breaks (a hop not traced here, a record lost).
func rolloutOf(in *inbound) *inbound {
	cur := in
	for hop := 0; hop < 8; hop++ {
		if cur.via == nil || cur.via.via == nil {
			return nil
		}
		cur = cur.via.via
		if cur.ri.gymSpan != "" && cur.ri.gymGroup == groups.Rollout {
			return cur
		}
	}
	return nil
}

// modelRoutes are the model server's routes (the /ng-rollout/<id> prefix
// stripped).
var modelRoutes = map[string]bool{"/v1/chat/completions": true, "/v1/responses": true, "/v1/messages": true}

// countMadeCall counts an agent's finished call to a model server in its
// rollout's calls made: a model route addressed to another process than the
// agent (whose own /v1/responses is a model route's path too): not to the
// port its /run came in on, nor made by a model call's handler (the model
// server's call upstream, which the walk from it would reach the /run by).
func countMadeCall(out *outbound) {
	if out.via == nil || isModelCall(out.via) {
		return // a model server's handler calling upstream: the agent's call is the one made
	}
	rest, _ := groups.StripRolloutPrefix(out.x.Path)
	if !modelRoutes[rest] || out.x.Method != "POST" {
		return
	}
	var r *inbound
	if out.via.ri.gymSpan != "" && out.via.ri.gymGroup == groups.Rollout {
		r = out.via
	} else {
		r = rolloutOf(out.via)
	}
	if r == nil || out.x.Remote.Port() == r.x.Local.Port() {
		return
	}
	if r.sum == nil {
		r.sum = &rolloutSum{}
	}
	r.sum.made++
}

// addToRollout counts a finished model call in its rollout's totals.
func addToRollout(in *inbound) {
	r := rolloutOf(in)
	if r == nil {
		return
	}
	if r.sum == nil {
		r.sum = &rolloutSum{}
	}
	s := r.sum
	s.calls++
	s.starts = append(s.starts, in.x.ReqStart)
	g := in.x.GenAI
	if g != nil && g.HasInput {
		s.input += g.Input
	} else {
		s.inMiss++
	}
	if g != nil && g.HasOutput {
		s.output += g.Output
	} else {
		s.outMiss++
	}
}

// rolloutAttrs are a gym.rollout span's totals: its model calls, and its
// input and output tokens when every call's count was read.
func rolloutAttrs(attrs []attribute.KeyValue, s *rolloutSum) []attribute.KeyValue {
	if s == nil {
		return append(attrs, attribute.Int("nemo.gym.rollout.model_calls", 0))
	}
	attrs = append(attrs, attribute.Int("nemo.gym.rollout.model_calls", max(s.calls, s.made)))
	if !s.whole() {
		return attrs // a call made that no answered one matches: the sums would be short
	}
	if s.inMiss == 0 {
		attrs = append(attrs, attribute.Int("nemo.gym.rollout.input_tokens", s.input))
	}
	if s.outMiss == 0 {
		attrs = append(attrs, attribute.Int("nemo.gym.rollout.output_tokens", s.output))
	}
	return attrs
}

// rolloutMeasures are the totals for Gym's metrics: the turn count and the
// gaps between consecutive turns' starts (ms).
func rolloutMeasures(s *rolloutSum) *RolloutMeasures {
	m := &RolloutMeasures{}
	if s == nil {
		return m
	}
	m.ModelCalls = max(s.calls, s.made)
	m.InputTokens, m.HasInput = s.input, s.inMiss == 0 && s.whole()
	m.OutputTokens, m.HasOutput = s.output, s.outMiss == 0 && s.whole()
	st := slices.Clone(s.starts)
	slices.Sort(st)
	for i := 1; i < len(st); i++ {
		m.TurnGapsMs = append(m.TurnGapsMs, float64(st[i]-st[i-1])/1e6)
	}
	return m
}

// genaiMeasures is a model call's GenAI for Gym's metrics; the dialect is
// the route's even when the kernel read nothing.
func genaiMeasures(in *inbound) *GenAIMeasures {
	m := &GenAIMeasures{Dialect: dialectOf(in.ri.gymSpan)}
	if g := in.x.GenAI; g != nil {
		m.ReqModel, m.RespModel = g.ReqModel, g.RespModel
		m.Input, m.HasInput = g.Input, g.HasInput
		m.Output, m.HasOutput = g.Output, g.HasOutput
	}
	return m
}

// dialectOf is the dialect of a gym.model.* span's name.
func dialectOf(gymSpan string) string {
	switch gymSpan {
	case "gym.model.chat_completions":
		return http.DialectChat
	case "gym.model.messages":
		return http.DialectMessages
	}
	return http.DialectResponses
}
