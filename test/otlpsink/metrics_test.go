package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("opening metrics output: %v", err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		out = append(out, append([]byte{}, sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func readPoints(t *testing.T, path string) []Point {
	t.Helper()
	var out []Point
	for _, line := range readLines(t, path) {
		var p Point
		if err := json.Unmarshal(line, &p); err != nil {
			t.Fatalf("line %q is not a data point: %v", line, err)
		}
		out = append(out, p)
	}
	return out
}

// newMeterProvider exports to the sink over OTLP/gRPC with the OTel Go SDK, as
// gymtrace does; the reader exports only when flushed.
func newMeterProvider(t *testing.T, addr string) *sdkmetric.MeterProvider {
	t.Helper()
	exp, err := otlpmetricgrpc.New(context.Background(), otlpmetricgrpc.WithEndpoint(addr), otlpmetricgrpc.WithInsecure(),
		otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatalf("creating metric exporter: %v", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "gymtrace"), attribute.Int("process.pid", 4242))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(time.Hour))))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp
}

func TestMetricsExportWritesEveryPoint(t *testing.T) {
	dir := t.TempDir()
	spans, metricsOut := filepath.Join(dir, "spans.jsonl"), filepath.Join(dir, "spans.metrics.jsonl")
	addr, stats := startSink(t, config{listen: "127.0.0.1:0", out: spans, metrics: metricsOut})
	mp := newMeterProvider(t, addr)
	m := mp.Meter("gymtrace", metric.WithInstrumentationVersion("0.1.0"))
	ctx := context.Background()

	reward, _ := m.Float64Histogram("gym.verify.reward", metric.WithExplicitBucketBoundaries(-1, 0, 1, 10))
	requests, _ := m.Int64Counter("http.server.request.count", metric.WithUnit("{request}"))
	active, _ := m.Int64UpDownCounter("gym.servers.active")
	rate, _ := m.Float64Gauge("gym.verify.success_rate", metric.WithDescription("verify calls answered 2xx"))
	res := metric.WithAttributes(attribute.String("nemo.gym.server.name", "simple_weather"))
	for _, v := range []float64{-3, -1.5e-3, 0.125, 7.000001, 200} {
		reward.Record(ctx, v, res)
	}
	requests.Add(ctx, 5, metric.WithAttributes(attribute.String("http.route", "/verify"), attribute.Int("http.response.status_code", 200)))
	requests.Add(ctx, 1, metric.WithAttributes(attribute.String("http.route", "/verify"), attribute.Int("http.response.status_code", 500)))
	active.Add(ctx, 3)
	rate.Record(ctx, 5.0/6, res)
	if err := mp.ForceFlush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	// Once the export returned, its points are in the file.
	points := readPoints(t, metricsOut)
	byName := map[string][]Point{}
	for _, p := range points {
		if p.Export != 1 {
			t.Errorf("export = %d, want 1: %+v", p.Export, p)
		}
		if p.Resource["service.name"] != "gymtrace" || p.Resource["process.pid"] != float64(4242) || p.Scope != "gymtrace" || p.ScopeVer != "0.1.0" {
			t.Errorf("resource/scope = %v %q %q", p.Resource, p.Scope, p.ScopeVer)
		}
		byName[p.Name] = append(byName[p.Name], p)
	}
	if len(points) != 5 {
		t.Fatalf("got %d points, want 5: %+v", len(points), points)
	}

	h := byName["gym.verify.reward"][0]
	if h.Type != "HISTOGRAM" || h.Temporality != "CUMULATIVE" || *h.Count != 5 || h.Attributes["nemo.gym.server.name"] != "simple_weather" {
		t.Errorf("histogram = %+v", h)
	}
	if want := []uint64{1, 1, 1, 1, 1}; !equal(h.BucketCounts, want) {
		t.Errorf("bucket counts = %v, want %v", h.BucketCounts, want)
	}
	if want := []Num{-1, 0, 1, 10}; !equal(h.ExplicitBounds, want) {
		t.Errorf("bounds = %v, want %v", h.ExplicitBounds, want)
	}
	if math.Abs(float64(*h.Sum)-(-3-1.5e-3+0.125+7.000001+200)) > 1e-9 || *h.Min != -3 || *h.Max != 200 {
		t.Errorf("sum/min/max = %v/%v/%v", *h.Sum, *h.Min, *h.Max)
	}
	if h.Start == 0 || h.Time < h.Start {
		t.Errorf("times %d..%d", h.Start, h.Time)
	}

	codes := map[float64]float64{}
	for _, p := range byName["http.server.request.count"] {
		if p.Type != "SUM" || p.Temporality != "CUMULATIVE" || p.Monotonic == nil || !*p.Monotonic || p.ValueType != "INT" || p.Unit != "{request}" {
			t.Errorf("counter point = %+v", p)
		}
		codes[p.Attributes["http.response.status_code"].(float64)] = p.Value.(float64)
	}
	if codes[200] != 5 || codes[500] != 1 || len(codes) != 2 {
		t.Errorf("request counts by status = %v", codes)
	}
	if a := byName["gym.servers.active"][0]; a.Type != "SUM" || *a.Monotonic || a.Value != float64(3) {
		t.Errorf("up-down counter = %+v", a)
	}
	if g := byName["gym.verify.success_rate"][0]; g.Type != "GAUGE" || g.ValueType != "DOUBLE" || g.Value != 5.0/6 ||
		g.Temporality != "" || g.Monotonic != nil || g.Description != "verify calls answered 2xx" {
		t.Errorf("gauge = %+v", g)
	}

	// The next export is numbered 2 and, cumulative, carries the totals.
	reward.Record(ctx, 0.5, res)
	if err := mp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	var second []Point
	for _, p := range readPoints(t, metricsOut) {
		if p.Export == 2 {
			second = append(second, p)
		}
	}
	if len(second) != 5 {
		t.Fatalf("second export: %d points, want 5", len(second))
	}
	for _, p := range second {
		if p.Name == "gym.verify.reward" && (*p.Count != 6 || !equal(p.BucketCounts, []uint64{1, 1, 2, 1, 1})) {
			t.Errorf("second histogram = %+v", p)
		}
	}
	if st := stats(); st.MetricRequests != 2 || st.DataPoints != 10 || st.Requests != 0 || st.Spans != 0 {
		t.Errorf("stats = %+v", st)
	}
	if b, err := os.ReadFile(spans); err != nil || len(b) != 0 {
		t.Errorf("spans file = %q, %v; want it empty", b, err)
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// rawMetrics builds what no SDK instrument sends on its own: an exponential
// histogram, a summary, non-finite values and a point flagged as empty.
func rawMetrics() pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "raw")
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("raw-scope")
	ts := pcommon.NewTimestampFromTime(time.Unix(1700000000, 5))

	g := sm.Metrics().AppendEmpty()
	g.SetName("gym.verify.success_rate")
	gauge := g.SetEmptyGauge()
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		dp := gauge.DataPoints().AppendEmpty()
		dp.SetDoubleValue(v)
		dp.SetTimestamp(ts)
	}
	g.Gauge().DataPoints().At(2).SetFlags(pmetric.DefaultDataPointFlags.WithNoRecordedValue(true))

	e := sm.Metrics().AppendEmpty()
	e.SetName("gym.verify.reward.exp")
	eh := e.SetEmptyExponentialHistogram()
	eh.SetAggregationTemporality(pmetric.AggregationTemporalityDelta)
	edp := eh.DataPoints().AppendEmpty()
	edp.SetCount(4)
	edp.SetScale(2)
	edp.SetZeroCount(1)
	edp.SetSum(-1.5)
	edp.Positive().SetOffset(-1)
	edp.Positive().BucketCounts().FromRaw([]uint64{1, 1})
	edp.Negative().BucketCounts().FromRaw([]uint64{1})
	edp.Attributes().PutInt("k", 7)

	s := sm.Metrics().AppendEmpty()
	s.SetName("gym.rollout.duration_ms.summary")
	sdp := s.SetEmptySummary().DataPoints().AppendEmpty()
	sdp.SetCount(3)
	sdp.SetSum(12.5)
	q := sdp.QuantileValues().AppendEmpty()
	q.SetQuantile(0.5)
	q.SetValue(4)
	return md
}

func sendRaw(t *testing.T, addr string, md pmetric.Metrics) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pmetricotlp.NewGRPCClient(cc).Export(ctx, pmetricotlp.NewExportRequestFromMetrics(md))
	return err
}

func TestMetricsPointsOfEveryType(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.jsonl")
	addr, _ := startSink(t, config{listen: "127.0.0.1:0", out: filepath.Join(dir, "s.jsonl"), metrics: out})
	if err := sendRaw(t, addr, rawMetrics()); err != nil {
		t.Fatalf("export: %v", err)
	}
	lines := readLines(t, out)
	if len(lines) != 5 {
		t.Fatalf("got %d lines, want 5:\n%s", len(lines), lines)
	}
	for i, want := range []string{`"value":"NaN"`, `"value":"+Inf"`, `"value":"-Inf"`} {
		if !strings.Contains(string(lines[i]), want) {
			t.Errorf("line %d = %s, want %s", i, lines[i], want)
		}
	}
	points := readPoints(t, out)
	if !math.IsNaN(float64(mustNum(t, points[0].Value))) || points[2].Flags != 1 || points[0].Flags != 0 || points[0].Time != 1700000000000000005 {
		t.Errorf("gauge points = %+v", points[:3])
	}
	e := points[3]
	if e.Type != "EXPONENTIAL_HISTOGRAM" || e.Temporality != "DELTA" || *e.Count != 4 || *e.Scale != 2 || *e.ZeroCount != 1 ||
		*e.Sum != -1.5 || e.Min != nil || e.Positive.Offset != -1 || !equal(e.Positive.BucketCounts, []uint64{1, 1}) ||
		!equal(e.Negative.BucketCounts, []uint64{1}) || e.Attributes["k"] != float64(7) {
		t.Errorf("exponential histogram = %+v", e)
	}
	if s := points[4]; s.Type != "SUMMARY" || *s.Count != 3 || *s.Sum != 12.5 || len(s.Quantiles) != 1 || s.Quantiles[0] != (Quantile{0.5, 4}) {
		t.Errorf("summary = %+v", s)
	}
	for _, p := range points {
		if p.Resource["service.name"] != "raw" || p.Scope != "raw-scope" {
			t.Errorf("resource/scope = %v %q", p.Resource, p.Scope)
		}
	}
}

func mustNum(t *testing.T, v any) Num {
	t.Helper()
	b, _ := json.Marshal(v)
	var n Num
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMetricsFormatOTLP(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.jsonl")
	addr, _ := startSink(t, config{listen: "127.0.0.1:0", out: filepath.Join(dir, "s.jsonl"), metrics: out, mformat: "otlp"})
	for i := 0; i < 2; i++ {
		if err := sendRaw(t, addr, rawMetrics()); err != nil {
			t.Fatalf("export: %v", err)
		}
	}
	lines := readLines(t, out)
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want one per request", len(lines))
	}
	md, err := (&pmetric.JSONUnmarshaler{}).UnmarshalMetrics(lines[1])
	if err != nil {
		t.Fatalf("line is not OTLP/JSON metrics: %v", err)
	}
	if md.DataPointCount() != 5 || md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(1).Name() != "gym.verify.reward.exp" {
		t.Errorf("round trip lost points: %d", md.DataPointCount())
	}
}

func TestMetricsFailForAndCountOnly(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.jsonl")
	addr, stats := startSink(t, config{listen: "127.0.0.1:0", out: filepath.Join(dir, "s.jsonl"), metrics: out, failFor: 300 * time.Millisecond})
	if err := sendRaw(t, addr, rawMetrics()); err == nil || !strings.Contains(err.Error(), "Unavailable") {
		t.Fatalf("export during --fail-for: err = %v, want Unavailable", err)
	}
	time.Sleep(350 * time.Millisecond)
	if err := sendRaw(t, addr, rawMetrics()); err != nil {
		t.Fatalf("export after --fail-for: %v", err)
	}
	if st := stats(); st.MetricRejected != 1 || st.MetricRequests != 1 || st.DataPoints != 5 || st.Rejected != 0 {
		t.Errorf("stats = %+v", st)
	}
	if n := len(readLines(t, out)); n != 5 {
		t.Errorf("%d lines, want the 5 points of the accepted request", n)
	}

	cfg, err := parseFlags([]string{"--count-only"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	addr, stats = startSink(t, cfg)
	if err := sendRaw(t, addr, rawMetrics()); err != nil {
		t.Fatal(err)
	}
	if st := stats(); st.MetricRequests != 1 || st.DataPoints != 5 {
		t.Errorf("count-only stats = %+v", st)
	}
}

// run creates the metrics file before any export and serves metrics on the
// listener it announces.
func TestRunServesMetricsNextToSpans(t *testing.T) {
	dir := t.TempDir()
	cfg, err := parseFlags([]string{"--out", filepath.Join(dir, "otlp-spans.jsonl")}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, cfg, pw, slog.New(slog.NewTextHandler(io.Discard, nil)))
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	metricsFile := filepath.Join(dir, "otlp-spans.metrics.jsonl")
	if b, err := os.ReadFile(metricsFile); err != nil || len(b) != 0 {
		t.Fatalf("metrics file before any export: %q, %v; want it there, empty", b, err)
	}
	mp := newMeterProvider(t, strings.TrimPrefix(strings.TrimSpace(line), "listening "))
	c, _ := mp.Meter("gymtrace").Int64Counter("gym.rollout.count")
	c.Add(context.Background(), 2)
	if err := mp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if p := readPoints(t, metricsFile); len(p) != 1 || p[0].Name != "gym.rollout.count" || p[0].Value != float64(2) {
		t.Fatalf("points = %+v", p)
	}
}
