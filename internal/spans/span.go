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
}
