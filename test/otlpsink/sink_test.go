package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// startSink serves a sink on a free port until the test ends.
func startSink(t *testing.T, cfg config) (addr string, stats func() Stats) {
	t.Helper()
	s := startSinkServer(t, cfg)
	return s.Addr().String(), s.Stats
}

// startSinkServer is startSink returning the sink itself (for HTTPAddr).
func startSinkServer(t *testing.T, cfg config) *sink {
	t.Helper()
	var out *os.File
	var w io.Writer // nil with count: --count-only
	if !cfg.count {
		var err error
		out, err = os.OpenFile(cfg.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		w = out
	}
	opts := sinkOptions{failFor: cfg.failFor, delay: cfg.delay, metricsFormat: cfg.mformat, httpListen: cfg.httpAddr}
	if cfg.metrics != "" {
		mf, err := os.OpenFile(cfg.metrics, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mf.Close() })
		opts.metricsOut = mf
	}
	s, err := newSink(cfg.listen, w, opts)
	if err != nil {
		t.Fatalf("starting sink: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("sink: %v", err)
		}
		if out != nil {
			out.Close()
		}
	})
	return s
}

// --count-only accepts and counts, writes nothing, and needs no --out.
func TestCountOnlyCountsAndWritesNothing(t *testing.T) {
	cfg, err := parseFlags([]string{"--count-only"}, io.Discard)
	if err != nil || !cfg.count {
		t.Fatalf("parseFlags(--count-only) = %+v, %v", cfg, err)
	}
	addr, stats := startSink(t, cfg)
	tr := newProvider(t, addr, "nemo-gym/simple_agent", false).Tracer("gymtrace-test")
	for i := 0; i < 3; i++ {
		_, s := tr.Start(context.Background(), "POST /run")
		s.End()
	}
	if st := stats(); st.Requests != 3 || st.Spans != 3 {
		t.Fatalf("stats %+v, want 3 requests of one span", st)
	}
}

func newProvider(t *testing.T, addr string, svc string, retry bool) *sdktrace.TracerProvider {
	t.Helper()
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(addr), otlptracegrpc.WithInsecure()}
	if retry {
		opts = append(opts, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
			Enabled: true, InitialInterval: 50 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxElapsedTime: 20 * time.Second,
		}))
	} else {
		opts = append(opts, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	}
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		t.Fatalf("creating exporter: %v", err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", svc),
		attribute.String("nemo.gym.server.type", "responses_api_agents"),
		attribute.Int("process.pid", 4242),
	)
	// The syncer exports on End, so once End returns the spans are in the file.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

func readSpans(t *testing.T, path string) []Span {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening sink output: %v", err)
	}
	defer f.Close()
	var out []Span
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var s Span
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("line %q is not a span: %v", sc.Text(), err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestExportWritesEverySpanAsJSON(t *testing.T) {
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	addr, stats := startSink(t, config{listen: "127.0.0.1:0", out: out})
	tp := newProvider(t, addr, "nemo-gym/simple_agent", false)
	tr := tp.Tracer("gymtrace-test")

	ctx, server := tr.Start(context.Background(), "POST /run", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", "POST"), attribute.Int("http.response.status_code", 200)))
	_, rollout := tr.Start(ctx, "gym.rollout", trace.WithAttributes(attribute.String("nemo.gym.rollout.id", "3-1")))
	linked := trace.Link{SpanContext: server.SpanContext(), Attributes: []attribute.KeyValue{attribute.String("why", "test")}}
	_, client := tr.Start(ctx, "HTTP POST", trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(linked),
		trace.WithAttributes(attribute.String("url.full", "http://127.0.0.1:1/verify"), attribute.Bool("b", true), attribute.Float64("f", 1.5)))
	client.SetStatus(codes.Error, "connection reset")
	client.End()
	rollout.End()
	server.End()

	spans := readSpans(t, out)
	if len(spans) != 3 {
		t.Fatalf("got %d spans, want 3: %+v", len(spans), spans)
	}
	byName := map[string]Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	srv, ro, cl := byName["POST /run"], byName["gym.rollout"], byName["HTTP POST"]

	if srv.Kind != "SERVER" || ro.Kind != "INTERNAL" || cl.Kind != "CLIENT" {
		t.Errorf("kinds = %s/%s/%s, want SERVER/INTERNAL/CLIENT", srv.Kind, ro.Kind, cl.Kind)
	}
	if srv.ParentSpanID != "" {
		t.Errorf("root parent_span_id = %q, want empty", srv.ParentSpanID)
	}
	if ro.ParentSpanID != srv.SpanID || cl.ParentSpanID != srv.SpanID {
		t.Errorf("parents = %q,%q want %q", ro.ParentSpanID, cl.ParentSpanID, srv.SpanID)
	}
	if want := server.SpanContext().TraceID().String(); srv.TraceID != want || cl.TraceID != want {
		t.Errorf("trace ids %q/%q, want %q", srv.TraceID, cl.TraceID, want)
	}
	if len(srv.SpanID) != 16 || len(srv.TraceID) != 32 {
		t.Errorf("ids not hex: span %q trace %q", srv.SpanID, srv.TraceID)
	}
	if srv.StartTimeUnixNano == 0 || srv.EndTimeUnixNano < srv.StartTimeUnixNano {
		t.Errorf("bad times %d..%d", srv.StartTimeUnixNano, srv.EndTimeUnixNano)
	}
	// JSON numbers decode as float64.
	if got := srv.Attributes["http.response.status_code"]; got != float64(200) {
		t.Errorf("status code attribute = %v (%T)", got, got)
	}
	if cl.Attributes["b"] != true || cl.Attributes["f"] != 1.5 || cl.Attributes["url.full"] != "http://127.0.0.1:1/verify" {
		t.Errorf("client attributes = %v", cl.Attributes)
	}
	if ro.Attributes["nemo.gym.rollout.id"] != "3-1" {
		t.Errorf("rollout attributes = %v", ro.Attributes)
	}
	if srv.Resource["service.name"] != "nemo-gym/simple_agent" || srv.Resource["process.pid"] != float64(4242) {
		t.Errorf("resource = %v", srv.Resource)
	}
	if cl.Status != (Status{Code: "ERROR", Message: "connection reset"}) || srv.Status.Code != "UNSET" {
		t.Errorf("status client=%+v server=%+v", cl.Status, srv.Status)
	}
	if len(cl.Links) != 1 || cl.Links[0].SpanID != srv.SpanID || cl.Links[0].Attributes["why"] != "test" {
		t.Errorf("links = %+v", cl.Links)
	}
	if len(srv.Links) != 0 || srv.Links == nil {
		t.Errorf("server links = %#v, want empty list", srv.Links)
	}
	if st := stats(); st.Spans != 3 || st.Requests != 3 || st.Rejected != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestFailForAnswersUnavailableThenAccepts(t *testing.T) {
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	addr, stats := startSink(t, config{listen: "127.0.0.1:0", out: out, failFor: 500 * time.Millisecond})

	// Without retry the exporter must see the outage as UNAVAILABLE.
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(addr), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(context.Background())
	rec := tracetest.NewSpanRecorder()
	_, sp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("t").Start(context.Background(), "lost")
	sp.End()
	start := time.Now()
	err = exp.ExportSpans(context.Background(), rec.Ended())
	if err == nil || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("export during --fail-for: err = %v, want Unavailable", err)
	}

	// With retry (the exporter's default behaviour) the span arrives after the outage.
	retry := newProvider(t, addr, "nemo-gym/a", true)
	_, sp = retry.Tracer("t").Start(context.Background(), "kept")
	sp.End()
	if time.Since(start) < 500*time.Millisecond {
		t.Errorf("export succeeded after %v, before the outage ended", time.Since(start))
	}
	spans := readSpans(t, out)
	if len(spans) != 1 || spans[0].Name != "kept" {
		t.Fatalf("spans = %+v, want only the retried one", spans)
	}
	if st := stats(); st.Rejected < 2 || st.Requests != 1 {
		t.Errorf("stats = %+v, want >=2 rejected and 1 accepted", st)
	}
}

func TestDelaySlowsEachExport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	addr, _ := startSink(t, config{listen: "127.0.0.1:0", out: out, delay: 300 * time.Millisecond})
	tp := newProvider(t, addr, "nemo-gym/m", false)
	start := time.Now()
	_, sp := tp.Tracer("t").Start(context.Background(), "slow")
	sp.End()
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("export took %v, want >= --delay 300ms", d)
	}
	if spans := readSpans(t, out); len(spans) != 1 {
		t.Fatalf("got %d spans, want 1", len(spans))
	}
}

func TestRunPrintsListeningLineFirst(t *testing.T) {
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, config{listen: "127.0.0.1:0", out: out}, pw, slog.New(slog.NewTextHandler(io.Discard, nil)))
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("reading first stdout line: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening 127.0.0.1:")
	if !ok || addr == "0" || addr == "" {
		t.Fatalf("first line = %q, want \"listening 127.0.0.1:PORT\"", line)
	}
	tp := newProvider(t, "127.0.0.1:"+addr, "nemo-gym/r", false)
	_, sp := tp.Tracer("t").Start(context.Background(), "POST /verify", trace.WithSpanKind(trace.SpanKindServer))
	sp.End()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if spans := readSpans(t, out); len(spans) != 1 || spans[0].Kind != "SERVER" {
		t.Fatalf("spans = %+v", spans)
	}
}

func TestParseFlags(t *testing.T) {
	if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Errorf("missing --out: err = %v, want one naming --out", err)
	}
	cfg, err := parseFlags([]string{"--out", "x", "--fail-for", "2s", "--delay", "10ms"}, io.Discard)
	if err != nil || cfg.failFor != 2*time.Second || cfg.delay != 10*time.Millisecond || cfg.listen != "127.0.0.1:0" {
		t.Errorf("cfg = %+v err = %v", cfg, err)
	}
	if _, err := parseFlags([]string{"--out", "x", "extra"}, io.Discard); err == nil {
		t.Error("stray argument accepted")
	}
	// Metrics go next to the spans unless told otherwise.
	for _, c := range []struct {
		args         []string
		want, format string
	}{
		{[]string{"--out", "/d/otlp-spans.jsonl"}, "/d/otlp-spans.metrics.jsonl", "points"},
		{[]string{"--out", "/d/spans"}, "/d/spans.metrics.jsonl", "points"},
		{[]string{"--out", "/d/s.jsonl", "--metrics-out", "/e/m.jsonl", "--metrics-format", "otlp"}, "/e/m.jsonl", "otlp"},
		{[]string{"--count-only"}, "", "points"},
		{[]string{"--count-only", "--metrics-out", "/e/m.jsonl"}, "/e/m.jsonl", "points"},
	} {
		cfg, err := parseFlags(c.args, io.Discard)
		if err != nil || cfg.metrics != c.want || cfg.mformat != c.format {
			t.Errorf("parseFlags(%q): metrics %q format %q err %v, want %q %q", c.args, cfg.metrics, cfg.mformat, err, c.want, c.format)
		}
	}
	if _, err := parseFlags([]string{"--out", "x", "--metrics-format", "csv"}, io.Discard); err == nil {
		t.Error("--metrics-format csv accepted")
	}
	if _, err := parseFlags([]string{"--out", "x", "--metrics-out", "x"}, io.Discard); err == nil {
		t.Error("--metrics-out equal to --out accepted")
	}
}

// OTLP export is at least once: a batch the sink stored whose answer came
// too late for the exporter is sent again. The sink writes each span once and
// counts the resend; a different span with the same ids (an exporter's bug,
// not a retry) is still written.
func TestResentSpansWrittenOnce(t *testing.T) {
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	s := startSinkServer(t, config{listen: "127.0.0.1:0", out: out})
	batch := func(names ...string) ptraceotlp.ExportRequest {
		td := ptrace.NewTraces()
		ss := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty()
		for i, name := range names {
			sp := ss.Spans().AppendEmpty()
			sp.SetName(name)
			sp.SetTraceID(pcommon.TraceID{1})
			sp.SetSpanID(pcommon.SpanID{byte(i + 1)})
		}
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	for _, req := range []ptraceotlp.ExportRequest{batch("POST /run", "POST /verify"), batch("POST /run", "POST /verify"), batch("POST /other")} {
		if _, err := s.Export(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	spans := readSpans(t, out)
	var names []string
	for _, sp := range spans {
		names = append(names, sp.Name)
	}
	if got := strings.Join(names, ","); got != "POST /run,POST /verify,POST /other" {
		t.Errorf("spans written: %s; want each resent span once, and the different span with a reused id", got)
	}
	if st := s.Stats(); st.Spans != 3 || st.Resent != 2 || st.Requests != 3 {
		t.Errorf("stats = %+v, want 3 spans written, 2 resent, 3 requests", st)
	}
}
