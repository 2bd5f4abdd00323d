package export

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

func TestJSONLHasExactlyTheDocumentedFields(t *testing.T) {
	var buf bytes.Buffer
	e := NewJSONL(&buf, NewResources("node-a"))
	base := time.Unix(1_700_000_000, 5)
	in := testSpans(base)
	in[3].Links = []trace.Link{{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: in[0].TraceID, SpanID: in[0].SpanID}), Attributes: []attribute.KeyValue{attribute.String("k", "v")}}}
	if err := e.Export(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(in) {
		t.Fatalf("%d lines for %d spans", len(lines), len(in))
	}
	want := []string{"attributes", "end_time_unix_nano", "kind", "name", "parent_span_id", "resource",
		"span_id", "start_time_unix_nano", "status", "trace_id"}
	for i, line := range lines {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", i, err)
		}
		var keys []string
		for k := range m {
			if k != "links" {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Errorf("line %d keys %v, want %v", i, keys, want)
		}
		if _, ok := m["links"]; ok != (i == 3) {
			t.Errorf("line %d: links present = %v", i, ok)
		}
	}

	var root, model JSONSpan
	json.Unmarshal([]byte(lines[2]), &root)
	json.Unmarshal([]byte(lines[0]), &model)
	if root.ParentSpanID != "" || root.Kind != "SERVER" || root.Status.Code != "ERROR" || root.Status.Message != "HTTP 500" {
		t.Errorf("root span: %+v", root)
	}
	if root.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || root.SpanID != "2222222222222222" {
		t.Errorf("root ids: %s %s", root.TraceID, root.SpanID)
	}
	if root.StartTimeUnixNano != uint64(base.UnixNano()) || root.EndTimeUnixNano != uint64(base.Add(100*time.Millisecond).UnixNano()) {
		t.Errorf("root times %d %d", root.StartTimeUnixNano, root.EndTimeUnixNano)
	}
	if root.Resource["service.name"] != "nemo-gym/simple_agent" || root.Resource["process.pid"] != float64(4242) ||
		root.Resource["k8s.node.name"] != "gpu-node-1" {
		t.Errorf("root resource %v", root.Resource)
	}
	if model.ParentSpanID != "1111111111111111" || model.Attributes["http.response.status_code"] != float64(200) {
		t.Errorf("model span: %+v", model)
	}
	if strings.Contains(buf.String(), "SECRET") || strings.Contains(strings.ToLower(buf.String()), "authorization") ||
		strings.Contains(strings.ToLower(buf.String()), "cookie") {
		t.Errorf("secret in jsonl output:\n%s", buf.String())
	}
}

func TestOpenJSONLAppendsToAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	for range 2 {
		e, err := OpenJSONL(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Export(context.Background(), testSpans(time.Now())[:2]); err != nil {
			t.Fatal(err)
		}
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(path)
	if n := strings.Count(string(b), "\n"); n != 4 {
		t.Fatalf("%d lines, want 4", n)
	}
	if _, err := OpenJSONL(filepath.Join(t.TempDir(), "no", "such", "dir", "x"), nil); err == nil {
		t.Fatal("opening a file in a missing directory succeeded")
	}
}

func TestSanitizeDropsSecretHeadersAndQueries(t *testing.T) {
	in := []attribute.KeyValue{
		attribute.String("http.request.method", "POST"),
		attribute.String("authorization", "Bearer a"),
		attribute.String("http.request.header.authorization", "Bearer b"),
		attribute.StringSlice("http.request.header.cookie", []string{"c"}),
		attribute.String("http.response.header.set-cookie", "d"),
		attribute.String("Set-Cookie", "e"),
		attribute.String("proxy-authorization", "f"),
		attribute.String("http.request.header.proxy_authorization", "g"),
		attribute.String("url.query", "token=h"),
		attribute.String("url.full", "http://user:pw@127.0.0.1:8000/v1/responses?token=i#frag"),
		attribute.String("url.path", "/v1/responses"),
	}
	out := Sanitize(in)
	var keys []string
	for _, kv := range out {
		keys = append(keys, string(kv.Key))
	}
	if !slices.Equal(keys, []string{"http.request.method", "url.full", "url.path"}) {
		t.Fatalf("kept %v", keys)
	}
	if got := out[1].Value.AsString(); got != "http://127.0.0.1:8000/v1/responses" {
		t.Fatalf("url.full = %q", got)
	}
	if in[1].Value.AsString() != "Bearer a" {
		t.Fatal("Sanitize modified its input")
	}
	clean := in[:1]
	if got := Sanitize(clean); &got[0] != &clean[0] {
		t.Fatal("Sanitize copied a clean slice")
	}
}
