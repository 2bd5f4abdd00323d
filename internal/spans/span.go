// Package spans turns assembled HTTP exchanges into the spans Gym itself would
// emit: names, groups, parents, attributes.
package spans

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
)

// Span is one finished span, ready for an exporter. Ids are decided by
// gymtrace, never by the OTel SDK, so joins across processes and nodes agree.
type Span struct {
	Name      string
	Kind      trace.SpanKind
	TraceID   trace.TraceID
	SpanID    trace.SpanID
	Parent    trace.SpanID // zero for a root
	Sampled   bool
	Start     time.Time
	End       time.Time
	Attrs     []attribute.KeyValue
	Links     []trace.Link
	Status    codes.Code
	StatusMsg string
	Group     string            // the span group that produced it, e.g. "server"
	Proc      *discover.Process // resource: the process the span was observed in
	// Measures are numbers Gym's metrics read (internal/gymmetrics). No
	// exporter sends them: the reward especially stays out of traces.
	Measures Measures
}

// Measures are what Gym's metrics read of a span's exchange that the span
// itself does not carry.
type Measures struct {
	ReqBody, RespBody uint64 // body bytes of the request and the response (SERVER and CLIENT spans)
	Host              string // the request's Host header as sent (SERVER spans)
	Status            int    // the response's status code, 0 when none was seen
	// Reward is the reward a /verify response carried, read in the kernel
	// (gym.verify spans); HasReward is false when it was not found.
	Reward    float64
	HasReward bool
	// GenAI is what the kernel read of a model call (gym.model.* spans,
	// and the SERVER span of one when model_call is off); nil otherwise.
	GenAI *GenAIMeasures
	// TTFB is a model call's time to its first response byte, from its
	// request's first byte, as the model server's syscalls saw them (ns).
	TTFB uint64
	// Rollout holds a gym.rollout span's totals; nil on other spans.
	Rollout *RolloutMeasures
}

// GenAIMeasures are a model call's values the kernel read (http.GenAI).
type GenAIMeasures struct {
	Dialect             string // nemo.gym.model.dialect: chat_completions, responses, messages
	ReqModel, RespModel string // "" when not read
	Input, Output       int
	HasInput, HasOutput bool
}

// RolloutMeasures are a rollout's totals over the model calls its /run made.
type RolloutMeasures struct {
	ModelCalls                int
	InputTokens, OutputTokens int
	HasInput, HasOutput       bool      // every call's count was read
	TurnGapsMs                []float64 // between consecutive model calls' starts
}
