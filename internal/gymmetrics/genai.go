package gymmetrics

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// Gym's newer attributed metrics (nemo_gym/telemetry/gym_metrics.py) and the
// OTel GenAI client metrics, from the spans gymtrace makes (docs/metrics.md):
// model calls (gym.model.* spans: model_call), tool calls (a resources
// server's SERVER spans on its tool routes: server), rollouts and their
// turns (gym.rollout spans: rollout).
const (
	GenAITokenUsage   = "gen_ai.client.token.usage"
	GenAIOpDuration   = "gen_ai.client.operation.duration"
	ModelCallDuration = "gym.model.call_duration_ms"
	ModelTTFB         = "gym.model.time_to_first_byte_ms"
	ToolCallDuration  = "gym.tool.call_duration_ms"
	RolloutCompleted  = "gym.rollout.completed_total"
	AgentTurnCount    = "gym.agent.turn_count"
	AgentTurnDuration = "gym.agent.turn_duration_ms"
	RolloutInput      = "gym.rollout.input_tokens"
	RolloutOutput     = "gym.rollout.output_tokens"
)

// The GenAI conventions' advisory boundaries.
var (
	tokenBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	opBuckets    = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
)

type genaiInst struct {
	tokens, rolloutIn, rolloutOut, turns metric.Int64Histogram
	opDur, callDur, ttfb, toolDur, gaps  metric.Float64Histogram
	completed                            metric.Int64Counter
}

func newGenAIInst(m metric.Meter) genaiInst {
	var g genaiInst
	g.tokens, _ = m.Int64Histogram(GenAITokenUsage, metric.WithUnit("{token}"),
		metric.WithDescription("Number of input and output tokens used"), metric.WithExplicitBucketBoundaries(tokenBuckets...))
	g.opDur, _ = m.Float64Histogram(GenAIOpDuration, metric.WithUnit("s"),
		metric.WithDescription("GenAI operation duration"), metric.WithExplicitBucketBoundaries(opBuckets...))
	g.callDur, _ = m.Float64Histogram(ModelCallDuration, metric.WithUnit("ms"),
		metric.WithDescription("Duration of one model call"))
	g.ttfb, _ = m.Float64Histogram(ModelTTFB, metric.WithUnit("ms"),
		metric.WithDescription("Time from a model call's request to the first byte of its response"))
	g.toolDur, _ = m.Float64Histogram(ToolCallDuration, metric.WithUnit("ms"),
		metric.WithDescription("Duration of one tool call"))
	g.completed, _ = m.Int64Counter(RolloutCompleted, metric.WithUnit("1"),
		metric.WithDescription("Rollouts completed, by outcome"))
	g.turns, _ = m.Int64Histogram(AgentTurnCount, metric.WithUnit("1"),
		metric.WithDescription("Model calls (turns) in one rollout"))
	g.gaps, _ = m.Float64Histogram(AgentTurnDuration, metric.WithUnit("ms"),
		metric.WithDescription("Time between the starts of consecutive turns of one rollout"))
	g.rolloutIn, _ = m.Int64Histogram(RolloutInput, metric.WithUnit("{token}"),
		metric.WithDescription("Input tokens of one rollout's model calls (read by gymtrace from the model server's answers)"),
		metric.WithExplicitBucketBoundaries(tokenBuckets...))
	g.rolloutOut, _ = m.Int64Histogram(RolloutOutput, metric.WithUnit("{token}"),
		metric.WithDescription("Output tokens of one rollout's model calls (read by gymtrace from the model server's answers)"),
		metric.WithExplicitBucketBoundaries(tokenBuckets...))
	return g
}

// measureModel records a gym.model.* span (r.mu held).
func (r *Recorder) measureModel(pr *proc, s *spans.Span) {
	ga := s.Measures.GenAI
	if ga == nil {
		return
	}
	ctx := context.Background()
	d := s.End.Sub(s.Start)
	gym := metric.WithAttributeSet(r.attrSet(pr, ModelCallDuration, []attribute.KeyValue{
		attribute.String("nemo.gym.model.dialect", ga.Dialect), attribute.String("nemo.gym.server.name", pr.p.ServerName)}))
	pr.gi.callDur.Record(ctx, ms(d), gym)
	if s.Measures.TTFB > 0 {
		pr.gi.ttfb.Record(ctx, float64(s.Measures.TTFB)/1e6, gym)
	}
	kv := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", spans.Provider(ga.Dialect)),
	}
	if ga.ReqModel != "" {
		kv = append(kv, attribute.String("gen_ai.request.model", ga.ReqModel))
	}
	if ga.RespModel != "" {
		kv = append(kv, attribute.String("gen_ai.response.model", ga.RespModel))
	}
	op := kv
	if s.Status == codes.Error {
		op = append(op[:len(op):len(op)], attribute.String("error.type", errorType(s)))
	}
	pr.gi.opDur.Record(ctx, d.Seconds(), metric.WithAttributeSet(r.attrSet(pr, GenAIOpDuration, op)))
	if ga.HasInput {
		in := append(kv[:len(kv):len(kv)], attribute.String("gen_ai.token.type", "input"))
		pr.gi.tokens.Record(ctx, int64(ga.Input), metric.WithAttributeSet(r.attrSet(pr, GenAITokenUsage, in)))
	}
	if ga.HasOutput {
		out := append(kv[:len(kv):len(kv)], attribute.String("gen_ai.token.type", "output"))
		pr.gi.tokens.Record(ctx, int64(ga.Output), metric.WithAttributeSet(r.attrSet(pr, GenAITokenUsage, out)))
	}
}

func errorType(s *spans.Span) string {
	for _, kv := range s.Attrs {
		if kv.Key == "error.type" {
			return kv.Value.AsString()
		}
	}
	return "_OTHER"
}

// measureRollout records a gym.rollout span's outcome, turns and tokens.
func (r *Recorder) measureRollout(pr *proc, s *spans.Span) {
	ctx := context.Background()
	outcome := "failure"
	if s.Measures.Status/100 == 2 {
		outcome = "success"
	}
	pr.gi.completed.Add(ctx, 1, metric.WithAttributeSet(r.attrSet(pr, RolloutCompleted,
		[]attribute.KeyValue{attribute.String("nemo.gym.rollout.outcome", outcome)})))
	m := s.Measures.Rollout
	if m == nil {
		return
	}
	agent := metric.WithAttributeSet(r.attrSet(pr, AgentTurnCount,
		[]attribute.KeyValue{attribute.String("nemo.gym.agent.name", pr.p.ServerName)}))
	pr.gi.turns.Record(ctx, int64(m.ModelCalls), agent)
	for _, g := range m.TurnGapsMs {
		pr.gi.gaps.Record(ctx, g, agent)
	}
	none := metric.WithAttributeSet(attribute.NewSet())
	if m.ModelCalls > 0 && m.HasInput {
		pr.gi.rolloutIn.Record(ctx, int64(m.InputTokens), none)
	}
	if m.ModelCalls > 0 && m.HasOutput {
		pr.gi.rolloutOut.Record(ctx, int64(m.OutputTokens), none)
	}
}

// notTools are a resources server's routes that are not its tools.
var notTools = map[string]bool{"/": true, "/seed_session": true, "/verify": true, "/aggregate_metrics": true,
	"/reverify_mode": true}

// measureTool records a resources server's SERVER span on a tool route:
// POST /<tool> (its /ng-rollout/<id> prefix stripped by the route).
func (r *Recorder) measureTool(pr *proc, s *spans.Span, e *exchange) {
	if pr.p.Role != discover.RoleResources || e.method != "POST" || notTools[e.route] || !strings.HasPrefix(e.route, "/") {
		return
	}
	tool := e.route[1:]
	if tool == "" || strings.Contains(tool, "/") {
		return
	}
	pr.gi.toolDur.Record(context.Background(), ms(s.End.Sub(s.Start)), metric.WithAttributeSet(r.attrSet(pr, ToolCallDuration,
		[]attribute.KeyValue{attribute.String("nemo.gym.tool.name", tool), attribute.String("nemo.gym.server.name", pr.p.ServerName)})))
}
