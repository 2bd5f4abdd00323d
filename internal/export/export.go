// Package export sends finished gymtrace spans somewhere a person can see them:
// an OTLP/gRPC collector (through the OTel Go SDK exporter), a JSON-lines file,
// or a tree printed on the terminal (the embedded default).
//
// Exporters are slow and can fail; the ring-buffer reader must never wait for
// them. Put a Pipeline in front of any Exporter: Submit never blocks, the queue
// is bounded, and whatever does not fit is counted, not hidden.
package export

import (
	"context"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// Exporter writes batches of finished spans. Export may block for as long as
// ctx allows; the Pipeline calls it from one goroutine at a time.
type Exporter interface {
	Export(ctx context.Context, batch []spans.Span) error
	Shutdown(ctx context.Context) error
}

// ScopeName is the instrumentation scope every exported span carries.
const ScopeName = "gymtrace"

// AttrTruncated marks a span that was still open when gymtrace stopped, as
// Gym's own telemetry marks it.
const AttrTruncated = attribute.Key("nemo.span.truncated")

// secretKey reports whether an attribute key could carry a credential: header
// names that hold one, in any of the spellings semantic conventions and ad-hoc
// instrumentation use (http.request.header.authorization, set_cookie, ...).
func secretKey(k attribute.Key) bool {
	s := strings.ToLower(string(k))
	return strings.Contains(s, "authorization") || strings.Contains(s, "cookie")
}

// Sanitize returns attrs without anything that must never leave gymtrace:
// attributes whose key names a secret header, query strings (which carry
// tokens as often as not) and url.query. The kernel already sends no header
// values but traceparent and Host; this is the last line of defence should a
// later change upstream add one. attrs is not modified; when nothing is
// removed it is returned as is.
func Sanitize(attrs []attribute.KeyValue) []attribute.KeyValue {
	clean := true
	for _, kv := range attrs {
		if dirtyAttr(kv) {
			clean = false
			break
		}
	}
	if clean {
		return attrs
	}
	out := make([]attribute.KeyValue, 0, len(attrs))
	for _, kv := range attrs {
		switch {
		case secretKey(kv.Key), kv.Key == "url.query":
			continue
		case kv.Key == "url.full" && kv.Value.Type() == attribute.STRING:
			out = append(out, kv.Key.String(stripQuery(kv.Value.AsString())))
		default:
			out = append(out, kv)
		}
	}
	return out
}

func dirtyAttr(kv attribute.KeyValue) bool {
	if secretKey(kv.Key) || kv.Key == "url.query" {
		return true
	}
	return kv.Key == "url.full" && kv.Value.Type() == attribute.STRING &&
		strings.ContainsAny(kv.Value.AsString(), "?#@")
}

// stripQuery drops the query, fragment and any user:password from a URL.
func stripQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		u = u[:i]
	}
	if p, err := url.Parse(u); err == nil && p.User != nil {
		p.User = nil
		return p.String()
	}
	return u
}

// KindName is the upper-case span kind name used by the jsonl and tree
// exporters (SERVER, CLIENT, INTERNAL, PRODUCER, CONSUMER).
func KindName(k trace.SpanKind) string {
	switch k {
	case trace.SpanKindServer:
		return "SERVER"
	case trace.SpanKindClient:
		return "CLIENT"
	case trace.SpanKindProducer:
		return "PRODUCER"
	case trace.SpanKindConsumer:
		return "CONSUMER"
	default:
		return "INTERNAL"
	}
}

// StatusName is the status code name used by the jsonl exporter.
func StatusName(c codes.Code) string {
	switch c {
	case codes.Ok:
		return "OK"
	case codes.Error:
		return "ERROR"
	default:
		return "UNSET"
	}
}

// truncated reports whether s was closed by gymtrace at shutdown.
func truncated(s *spans.Span) bool {
	for _, kv := range s.Attrs {
		if kv.Key == AttrTruncated && kv.Value.Type() == attribute.BOOL && kv.Value.AsBool() {
			return true
		}
	}
	return false
}

func attrString(s *spans.Span, k attribute.Key) string {
	for _, kv := range s.Attrs {
		if kv.Key == k {
			return kv.Value.Emit()
		}
	}
	return ""
}
