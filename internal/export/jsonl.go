package export

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// JSONSpan is one line of the jsonl exporter's output.
type JSONSpan struct {
	Name              string         `json:"name"`
	Kind              string         `json:"kind"` // SERVER, CLIENT, INTERNAL
	TraceID           string         `json:"trace_id"`
	SpanID            string         `json:"span_id"`
	ParentSpanID      string         `json:"parent_span_id"` // "" for a root
	StartTimeUnixNano uint64         `json:"start_time_unix_nano"`
	EndTimeUnixNano   uint64         `json:"end_time_unix_nano"`
	Attributes        map[string]any `json:"attributes"`
	Resource          map[string]any `json:"resource"`
	Status            JSONStatus     `json:"status"`
	Links             []JSONLink     `json:"links,omitempty"`
}

// JSONStatus is a span status: code UNSET, OK or ERROR.
type JSONStatus struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// JSONLink is a link to another span.
type JSONLink struct {
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// JSONLExporter writes one JSON object per span and line.
type JSONLExporter struct {
	mu     sync.Mutex
	w      *bufio.Writer
	closer io.Closer
	res    *Resources
	resMap map[*resource.Resource]map[string]any

	line    []byte                        // the line being encoded (appendSpanJSON)
	resJSON map[*resource.Resource][]byte // encoded resources
	attrIdx []int                         // scratch of appendAttrs
}

// NewJSONL writes to w, which it never closes. res may be nil.
func NewJSONL(w io.Writer, res *Resources) *JSONLExporter {
	if res == nil {
		res = NewResources("")
	}
	return &JSONLExporter{w: bufio.NewWriter(w), res: res, resMap: make(map[*resource.Resource]map[string]any)}
}

// OpenJSONL writes to the file at path ("-" or "" is stdout), appending to it
// if it exists.
func OpenJSONL(path string, res *Resources) (*JSONLExporter, error) {
	if path == "" || path == "-" {
		return NewJSONL(os.Stdout, res), nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the jsonl output: %w (check --output names a writable file)", err)
	}
	e := NewJSONL(f, res)
	e.closer = f
	return e, nil
}

// Export writes batch and flushes, so a reader following the file sees whole
// lines and a crash loses at most the batch in hand.
func (e *JSONLExporter) Export(_ context.Context, batch []spans.Span) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range batch {
		e.line = e.appendSpanJSON(e.line[:0], &batch[i])
		if _, err := e.w.Write(e.line); err != nil {
			return fmt.Errorf("writing span %s as JSON: %w", batch[i].Name, err)
		}
	}
	if err := e.w.Flush(); err != nil {
		return fmt.Errorf("writing jsonl spans: %w", err)
	}
	return nil
}

// Shutdown flushes and closes the file (not stdout or a caller's writer).
func (e *JSONLExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.w.Flush()
	if e.closer != nil {
		if cerr := e.closer.Close(); err == nil {
			err = cerr
		}
		e.closer = nil
	}
	if err != nil {
		return fmt.Errorf("closing the jsonl output: %w", err)
	}
	return nil
}

// ToJSON converts one span as the jsonl exporter writes it.
func ToJSON(s *spans.Span, res *Resources) JSONSpan {
	e := JSONLExporter{res: res, resMap: map[*resource.Resource]map[string]any{}}
	return e.toJSON(s)
}

func (e *JSONLExporter) toJSON(s *spans.Span) JSONSpan {
	js := JSONSpan{
		Name:              s.Name,
		Kind:              KindName(s.Kind),
		TraceID:           s.TraceID.String(),
		SpanID:            s.SpanID.String(),
		StartTimeUnixNano: unixNano(s.Start.UnixNano()),
		EndTimeUnixNano:   unixNano(s.End.UnixNano()),
		Attributes:        attrMap(Sanitize(s.Attrs)),
		Resource:          e.resource(s),
		Status:            JSONStatus{Code: StatusName(s.Status)},
	}
	if s.Parent.IsValid() {
		js.ParentSpanID = s.Parent.String()
	}
	if js.Status.Code == "ERROR" {
		js.Status.Message = s.StatusMsg
	}
	for _, l := range s.Links {
		js.Links = append(js.Links, JSONLink{
			TraceID:    l.SpanContext.TraceID().String(),
			SpanID:     l.SpanContext.SpanID().String(),
			Attributes: attrMapOmitEmpty(Sanitize(l.Attributes)),
		})
	}
	return js
}

func (e *JSONLExporter) resource(s *spans.Span) map[string]any {
	r := e.res.For(s.Proc)
	if m, ok := e.resMap[r]; ok {
		return m
	}
	if len(e.resMap) >= maxCachedResources {
		clear(e.resMap)
	}
	m := attrMap(r.Attributes())
	e.resMap[r] = m
	return m
}

// marshalNoHTML is json.Marshal without HTML escaping and the newline an
// Encoder adds.
func marshalNoHTML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func unixNano(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

func attrMap(attrs []attribute.KeyValue) map[string]any {
	m := make(map[string]any, len(attrs))
	for _, kv := range attrs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

func attrMapOmitEmpty(attrs []attribute.KeyValue) map[string]any {
	if len(attrs) == 0 {
		return nil
	}
	return attrMap(attrs)
}
