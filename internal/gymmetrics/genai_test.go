package gymmetrics

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/spans"
)

var modelProc = &discover.Process{PID: 400, Role: discover.RoleModel, ServerName: "policy_model", StartTime: 1}

func TestGenAIMetricsFromSpans(t *testing.T) {
	r, exp := newTest(t, Config{})
	call := span("gym.model.chat_completions", trace.SpanKindInternal, "model_call", modelProc, 250*time.Millisecond)
	call.Measures.GenAI = &spans.GenAIMeasures{Dialect: "chat_completions", ReqModel: "m", RespModel: "m-1",
		Input: 100, Output: 7, HasInput: true, HasOutput: true}
	call.Measures.TTFB = uint64(40 * time.Millisecond)
	noOut := call
	noOut.Measures.GenAI = &spans.GenAIMeasures{Dialect: "chat_completions", ReqModel: "m", RespModel: "m-1", Input: 50, HasInput: true}
	ok := span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Second)
	ok.Measures.Status = 200
	ok.Measures.Rollout = &spans.RolloutMeasures{ModelCalls: 3, InputTokens: 300, OutputTokens: 21, HasInput: true, HasOutput: true,
		TurnGapsMs: []float64{10, 20}}
	failed := span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Second)
	failed.Measures.Status = 500
	failed.Measures.Rollout = &spans.RolloutMeasures{ModelCalls: 1, InputTokens: 5, HasInput: true}
	r.Observe([]spans.Span{call, noOut, ok, failed,
		serverSpan(resProc, "/get_weather", 200, 3*time.Millisecond), serverSpan(resProc, "/verify", 200, time.Millisecond),
		serverSpan(resProc, "/seed_session", 200, time.Millisecond)})
	got := flush(t, r, exp)

	m := got["nemo-gym/policy_model"]
	tok, isInt := m[GenAITokenUsage].Data.(metricdata.Histogram[int64])
	if !isInt {
		t.Fatalf("%s: %#v", GenAITokenUsage, m[GenAITokenUsage].Data)
	}
	var in, out int64
	for _, p := range tok.DataPoints {
		v, _ := p.Attributes.Value("gen_ai.token.type")
		if rm, _ := p.Attributes.Value("gen_ai.response.model"); rm.AsString() != "m-1" {
			t.Errorf("token point without its response model: %v", p.Attributes)
		}
		switch v.AsString() {
		case "input":
			in += p.Sum
		case "output":
			out += p.Sum
		}
	}
	if in != 150 || out != 7 {
		t.Errorf("token usage: input %d output %d, want 150 and 7", in, out)
	}
	if d := hist(t, m[ModelCallDuration]); d.Count != 2 || d.Sum != 500 {
		t.Errorf("call duration: %d, %v", d.Count, d.Sum)
	} else if v, _ := d.Attributes.Value("nemo.gym.model.dialect"); v.AsString() != "chat_completions" {
		t.Errorf("call duration attributes %v", d.Attributes)
	}
	if d := hist(t, m[ModelTTFB]); d.Count != 2 || d.Sum != 80 {
		t.Errorf("ttfb: %d, %v", d.Count, d.Sum)
	}
	if d := hist(t, m[GenAIOpDuration]); d.Count != 2 || d.Sum != 0.5 {
		t.Errorf("operation duration: %d, %v", d.Count, d.Sum)
	}

	a := got["nemo-gym/simple_agent"]
	done := a[RolloutCompleted].Data.(metricdata.Sum[int64])
	by := map[string]int64{}
	for _, p := range done.DataPoints {
		v, _ := p.Attributes.Value("nemo.gym.rollout.outcome")
		by[v.AsString()] += p.Value
	}
	if by["success"] != 1 || by["failure"] != 1 || len(by) != 2 {
		t.Errorf("completed: %v", by)
	}
	turns := a[AgentTurnCount].Data.(metricdata.Histogram[int64]).DataPoints
	if len(turns) != 1 || turns[0].Count != 2 || turns[0].Sum != 4 {
		t.Errorf("turn count %+v", turns)
	} else if v, _ := turns[0].Attributes.Value(attribute.Key("nemo.gym.agent.name")); v.AsString() != "simple_agent" {
		t.Errorf("turn count attributes %v", turns[0].Attributes)
	}
	if g := hist(t, a[AgentTurnDuration]); g.Count != 2 || g.Sum != 30 {
		t.Errorf("turn gaps %d %v", g.Count, g.Sum)
	}
	ri := a[RolloutInput].Data.(metricdata.Histogram[int64]).DataPoints
	ro := a[RolloutOutput].Data.(metricdata.Histogram[int64]).DataPoints
	if len(ri) != 1 || ri[0].Count != 2 || ri[0].Sum != 305 || len(ro) != 1 || ro[0].Count != 1 || ro[0].Sum != 21 {
		t.Errorf("rollout tokens: in %+v out %+v (a rollout without every count has no sum)", ri, ro)
	}

	tool := hist(t, got["nemo-gym/simple_weather"][ToolCallDuration])
	if v, _ := tool.Attributes.Value("nemo.gym.tool.name"); tool.Count != 1 || v.AsString() != "get_weather" {
		t.Errorf("tool calls: %d %v, want only get_weather", tool.Count, tool.Attributes)
	}
}
