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

	line    []byte                        // the line being encoded (appendSpanJSON)
	resJSON map[*resource.Resource][]byte // encoded resources
	attrIdx []int                         // scratch of appendAttrs
}

// NewJSONL writes to w, which it never closes. res may be nil.
func NewJSONL(w io.Writer, res *Resources) *JSONLExporter {
	if res == nil {
		res = NewResources("")
	}
	return &JSONLExporter{w: bufio.NewWriter(w), res: res}
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
