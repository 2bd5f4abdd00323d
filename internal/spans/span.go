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
}
