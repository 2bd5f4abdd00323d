package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The OTel Go SDK's OTLP/HTTP exporters (http/protobuf, what the Python
// SDK's http exporter speaks too) reach the same files as over gRPC.
func TestHTTPExportersWriteSpansAndPoints(t *testing.T) {
	dir := t.TempDir()
	out, mout := filepath.Join(dir, "s.jsonl"), filepath.Join(dir, "m.jsonl")
	s := startSinkServer(t, config{listen: "127.0.0.1:0", httpAddr: "127.0.0.1:0", out: out, metrics: mout})
	addr := s.HTTPAddr().String()

	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(addr), otlptracehttp.WithInsecure(),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "nemo-gym/simple_weather"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	defer tp.Shutdown(context.Background())
	ctx, parent := tp.Tracer("t").Start(context.Background(), "POST /verify", trace.WithSpanKind(trace.SpanKindServer))
	_, child := tp.Tracer("t").Start(ctx, "gym.verify")
	child.End()
	parent.End()
	spans := readSpans(t, out)
	if len(spans) != 2 || spans[0].Name != "gym.verify" || spans[1].Kind != "SERVER" ||
		spans[0].ParentSpanID != spans[1].SpanID || spans[1].Resource["service.name"] != "nemo-gym/simple_weather" {
		t.Fatalf("spans = %+v", spans)
	}

	mexp, err := otlpmetrichttp.New(context.Background(), otlpmetrichttp.WithEndpoint(addr), otlpmetrichttp.WithInsecure(),
		otlpmetrichttp.WithCompression(otlpmetrichttp.GzipCompression),
		otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(time.Hour))))
	defer mp.Shutdown(context.Background())
	h, _ := mp.Meter("t").Float64Histogram("gym.verify.duration_ms")
	h.Record(context.Background(), 12.5)
	if err := mp.ForceFlush(context.Background()); err != nil {
		t.Fatalf("metrics over OTLP/HTTP (gzip): %v", err)
	}
	pts := readPoints(t, mout)
	if len(pts) != 1 || pts[0].Name != "gym.verify.duration_ms" || pts[0].Count == nil || *pts[0].Count != 1 {
		t.Fatalf("points = %+v", pts)
	}
	if st := s.Stats(); st.Requests != 2 || st.Spans != 2 || st.MetricRequests != 1 || st.DataPoints != 1 {
		t.Errorf("stats = %+v", st)
	}
}

var rawSpanIDs atomic.Uint32

func rawTraces(n int) []byte {
	td := ptrace.NewTraces()
	ss := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty()
	for i := 0; i < n; i++ {
		sp := ss.Spans().AppendEmpty()
		sp.SetName("HTTP POST")
		sp.SetKind(ptrace.SpanKindClient)
		sp.SetTraceID(pcommon.TraceID{1, 2, 3})
		// Ids of their own across calls: the sink writes a span sent again
		// only once (TestResentSpansWrittenOnce).
		id := rawSpanIDs.Add(1)
		sp.SetSpanID(pcommon.SpanID{byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)})
	}
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		panic(err)
	}
	return b
}

func post(t *testing.T, url, ctype, enc string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// Raw requests: protobuf, gzip, JSON, and the errors an exporter can meet.
func TestHTTPRequestsAndErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "s.jsonl")
	s := startSinkServer(t, config{listen: "127.0.0.1:0", httpAddr: "127.0.0.1:0", out: out, metrics: filepath.Join(dir, "m.jsonl"),
		failFor: 300 * time.Millisecond})
	base := "http://" + s.HTTPAddr().String()

	// --fail-for: 503, which OTLP/HTTP exporters retry.
	if resp, _ := post(t, base+"/v1/traces", ctProtobuf, "", rawTraces(1)); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("during --fail-for: %d, want 503", resp.StatusCode)
	}
	time.Sleep(350 * time.Millisecond)

	resp, body := post(t, base+"/v1/traces", ctProtobuf+"; charset=binary", "", rawTraces(2))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ctProtobuf {
		t.Fatalf("protobuf: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if err := ptraceotlp.NewExportResponse().UnmarshalProto(body); err != nil {
		t.Fatalf("the answer is not an ExportTraceServiceResponse: %v", err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(rawTraces(3))
	zw.Close()
	if resp, body := post(t, base+"/v1/traces", ctProtobuf, "gzip", zb.Bytes()); resp.StatusCode != 200 {
		t.Fatalf("gzip: %d %s", resp.StatusCode, body)
	}
	js := `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331","name":"POST /run","kind":2}]}]}]}`
	if resp, body := post(t, base+"/v1/traces", ctJSON, "", []byte(js)); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ctJSON {
		t.Fatalf("JSON: %d %s", resp.StatusCode, body)
	}
	spans := readSpans(t, out)
	if len(spans) != 6 || spans[5].Name != "POST /run" || spans[5].Kind != "SERVER" {
		t.Fatalf("spans = %+v", spans)
	}

	for _, c := range []struct {
		path, ctype, enc string
		body             []byte
		want             int
	}{
		{"/v1/traces", "text/plain", "", rawTraces(1), http.StatusUnsupportedMediaType},
		{"/v1/traces", ctProtobuf, "br", rawTraces(1), http.StatusUnsupportedMediaType},
		{"/v1/traces", ctProtobuf, "gzip", []byte("not gzip"), http.StatusBadRequest},
		{"/v1/traces", ctProtobuf, "", []byte{0xff, 0xff, 0xff}, http.StatusBadRequest},
		{"/v1/metrics", ctJSON, "", []byte("{"), http.StatusBadRequest},
		{"/v1/logs", ctProtobuf, "", nil, http.StatusNotFound},
	} {
		if resp, _ := post(t, base+c.path, c.ctype, c.enc, c.body); resp.StatusCode != c.want {
			t.Errorf("%s %s %s: %d, want %d", c.path, c.ctype, c.enc, resp.StatusCode, c.want)
		}
	}
	if resp, err := http.Get(base + "/v1/traces"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v, want 405", resp, err)
	}
	if st := s.Stats(); st.Rejected != 1 || st.Requests != 3 || st.Spans != 6 {
		t.Errorf("stats = %+v", st)
	}
}

// run announces the HTTP listener on the second stdout line, and a sink
// counting only (as the bench runs it) accepts over HTTP.
func TestRunPrintsHTTPListeningLine(t *testing.T) {
	cfg, err := parseFlags([]string{"--count-only", "--http-listen", "127.0.0.1:0"}, io.Discard)
	if err != nil || cfg.httpAddr != "127.0.0.1:0" {
		t.Fatalf("parseFlags = %+v, %v", cfg, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, cfg, pw, slog.New(slog.NewTextHandler(io.Discard, nil)))
		pw.Close()
	}()
	br := bufio.NewReader(pr)
	first, _ := br.ReadString('\n')
	second, _ := br.ReadString('\n')
	go io.Copy(io.Discard, br)
	if !strings.HasPrefix(first, "listening 127.0.0.1:") {
		t.Fatalf("first line = %q", first)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(second), "listening-http ")
	if !ok || strings.HasSuffix(addr, ":0") {
		t.Fatalf("second line = %q, want \"listening-http HOST:PORT\"", second)
	}
	if resp, body := post(t, "http://"+addr+"/v1/traces", ctProtobuf, "", rawTraces(4)); resp.StatusCode != 200 {
		t.Fatalf("count-only over HTTP: %d %s", resp.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
