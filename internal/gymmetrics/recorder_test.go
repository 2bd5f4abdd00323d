package gymmetrics

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// memExporter keeps what the periodic readers export.
type memExporter struct {
	mu  sync.Mutex
	got []metricdata.ResourceMetrics
}

func (m *memExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}
func (m *memExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (m *memExporter) Export(_ context.Context, rm *metricdata.ResourceMetrics) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got = append(m.got, *rm)
	return nil
}
func (m *memExporter) ForceFlush(context.Context) error { return nil }
func (m *memExporter) Shutdown(context.Context) error   { return nil }

// last returns, per service.name, the newest export's metrics by name.
func (m *memExporter) last() map[string]map[string]metricdata.Metrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]map[string]metricdata.Metrics{}
	for _, rm := range m.got {
		v, _ := rm.Resource.Set().Value("service.name")
		byName := map[string]metricdata.Metrics{}
		for _, sm := range rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				byName[mt.Name] = mt
			}
		}
		out[v.AsString()] = byName
	}
	return out
}

var (
	agentProc = &discover.Process{PID: 100, Role: discover.RoleAgent, ServerName: "simple_agent", StartTime: 1}
	resProc   = &discover.Process{PID: 200, Role: discover.RoleResources, ServerName: "simple_weather", StartTime: 1}
	orchProc  = &discover.Process{PID: 300, Role: discover.RoleOrchestrator, StartTime: 1}
	t0        = time.Unix(1_700_000_000, 0)
)

func span(name string, kind trace.SpanKind, group string, p *discover.Process, d time.Duration, attrs ...attribute.KeyValue) spans.Span {
	return spans.Span{Name: name, Kind: kind, Group: group, Proc: p, Start: t0, End: t0.Add(d), Attrs: attrs, Sampled: true}
}

func serverSpan(p *discover.Process, route string, status int, d time.Duration) spans.Span {
	s := span("POST "+route, trace.SpanKindServer, "server", p, d,
		attribute.String("http.request.method", "POST"),
		attribute.String("url.scheme", "http"),
		attribute.String("http.route", route),
		attribute.Int("http.response.status_code", status),
		attribute.String("server.address", "127.0.0.1"),
		attribute.Int("server.port", 8001))
	s.Measures = spans.Measures{ReqBody: 100, RespBody: 2000, Host: "127.0.0.1:8001"}
	return s
}

func verifySpan(reward float64, has bool, failed bool) spans.Span {
	s := span("gym.verify", trace.SpanKindInternal, "verify", resProc, 20*time.Millisecond)
	s.Measures = spans.Measures{Reward: reward, HasReward: has, Status: 200}
	if failed {
		s.Status, s.Measures.Status = codes.Error, 500
	}
	return s
}

func newTest(t *testing.T, cfg Config) (*Recorder, *memExporter) {
	t.Helper()
	exp := &memExporter{}
	cfg.Exporter = exp
	cfg.Prometheus = true
	cfg.Resources = export.NewResources("host-a")
	r := New(cfg)
	t.Cleanup(func() { r.Close(context.Background()) })
	return r, exp
}

func flush(t *testing.T, r *Recorder, exp *memExporter) map[string]map[string]metricdata.Metrics {
	t.Helper()
	if err := r.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return exp.last()
}

func hist(t *testing.T, m metricdata.Metrics) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || len(h.DataPoints) != 1 {
		t.Fatalf("%s: want one float histogram point, got %#v", m.Name, m.Data)
	}
	return h.DataPoints[0]
}

func TestGymMetricsFromSpans(t *testing.T) {
	r, exp := newTest(t, Config{Reward: true})
	r.Observe([]spans.Span{
		span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, 1500*time.Millisecond),
		span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, 500*time.Millisecond),
		verifySpan(0.75, true, false),
		verifySpan(-1.5e-3, true, false),
		verifySpan(0, false, false), // not found: nothing recorded, counted
		verifySpan(0, false, true),  // a 500: no reward expected
	})
	// Unsampled spans count the same; truncated ones are not measured.
	un := span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Second)
	un.Sampled = false
	tr := span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Hour, attribute.Bool("nemo.span.truncated", true))
	r.Observe([]spans.Span{un, tr})

	got := flush(t, r, exp)
	ag := got["nemo-gym/simple_agent"]
	ro := hist(t, ag[RolloutDuration])
	if ro.Count != 3 || ro.Sum != 3000 || ro.Attributes.Len() != 0 {
		t.Errorf("rollout: count %d sum %v attrs %v, want 3, 3000 ms, none", ro.Count, ro.Sum, ro.Attributes)
	}
	if u := ag[RolloutDuration].Unit; u != "ms" {
		t.Errorf("rollout unit %q", u)
	}
	rs := got["nemo-gym/simple_weather"]
	if v := hist(t, rs[VerifyDuration]); v.Count != 4 {
		t.Errorf("verify count %d, want 4", v.Count)
	}
	rw := hist(t, rs[VerifyReward])
	if rw.Count != 2 || math.Abs(rw.Sum-(0.75-1.5e-3)) > 1e-12 {
		t.Errorf("reward count %d sum %v", rw.Count, rw.Sum)
	}
	g, ok := rs[VerifySuccess].Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 0.75 {
		t.Errorf("success rate %#v, want 3/4", rs[VerifySuccess].Data)
	}
	if _, ok := ag[ServerDurationOld]; ok {
		t.Error("http.server.duration without any server span")
	}
	if st := r.Stats(); st.RewardMissing != 1 || st.Processes != 2 {
		t.Errorf("stats %+v, want 1 reward missing, 2 processes", st)
	}
	sum := r.Summary()
	if sum.Rollouts != 3 || sum.RolloutP50 != time.Second || sum.RolloutP99 != 1500*time.Millisecond ||
		sum.VerifyOK != 3 || sum.VerifyAll != 4 {
		t.Errorf("summary %+v", sum)
	}
}

func attrsOf(t *testing.T, m metricdata.Metrics) map[string]attribute.Value {
	t.Helper()
	out := map[string]attribute.Value{}
	var set attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		set = d.DataPoints[0].Attributes
	case metricdata.Histogram[int64]:
		set = d.DataPoints[0].Attributes
	default:
		t.Fatalf("%s: %T", m.Name, m.Data)
	}
	for _, kv := range set.ToSlice() {
		out[string(kv.Key)] = kv.Value
	}
	return out
}

func TestHTTPServerMetricsOldConventions(t *testing.T) {
	r, exp := newTest(t, Config{})
	r.Observe([]spans.Span{serverSpan(resProc, "/ng-rollout/{rollout_id}/verify", 200, 12400*time.Microsecond)})
	got := flush(t, r, exp)["nemo-gym/simple_weather"]
	d := got[ServerDurationOld]
	if d.Unit != "ms" || hist(t, d).Sum != 12 {
		t.Errorf("duration unit %q sum %v, want ms and a whole 12", d.Unit, hist(t, d).Sum)
	}
	a := attrsOf(t, d)
	want := map[string]string{"http.method": "POST", "http.scheme": "http", "http.flavor": "1.1",
		"http.host": "127.0.0.1:8001", "http.server_name": "127.0.0.1:8001", "http.target": "/ng-rollout/{rollout_id}/verify"}
	for k, v := range want {
		if a[k].AsString() != v {
			t.Errorf("%s = %q, want %q", k, a[k].AsString(), v)
		}
	}
	if a["http.status_code"].AsInt64() != 200 || a["net.host.port"].AsInt64() != 8001 || len(a) != 8 {
		t.Errorf("attrs %v", a)
	}
	for _, n := range []string{ServerReqSizeOld, ServerRespSizeOld} {
		if _, ok := got[n]; !ok {
			t.Errorf("no %s", n)
		}
	}
	for _, n := range []string{ServerDurationNew, ServerReqSizeNew} {
		if _, ok := got[n]; ok {
			t.Errorf("%s with the old conventions", n)
		}
	}
}

func TestHTTPMetricsStableAndDup(t *testing.T) {
	r, exp := newTest(t, Config{Semconv: SemconvFromEnv("http")})
	r.Observe([]spans.Span{serverSpan(resProc, "/verify", 500, 250*time.Millisecond)})
	got := flush(t, r, exp)["nemo-gym/simple_weather"]
	d := got[ServerDurationNew]
	if d.Unit != "s" || hist(t, d).Sum != 0.25 {
		t.Errorf("duration unit %q sum %v", d.Unit, hist(t, d).Sum)
	}
	a := attrsOf(t, d)
	if a["http.request.method"].AsString() != "POST" || a["http.route"].AsString() != "/verify" ||
		a["http.response.status_code"].AsInt64() != 500 || a["error.type"].AsString() != "500" {
		t.Errorf("attrs %v", a)
	}
	if _, ok := got[ServerDurationOld]; ok {
		t.Error("old duration with http")
	}

	r2, exp2 := newTest(t, Config{Semconv: SemconvFromEnv("database,http/dup")})
	r2.Observe([]spans.Span{serverSpan(resProc, "/verify", 200, time.Millisecond)})
	got = flush(t, r2, exp2)["nemo-gym/simple_weather"]
	for _, n := range []string{ServerDurationOld, ServerDurationNew, ServerReqSizeOld, ServerReqSizeNew} {
		if _, ok := got[n]; !ok {
			t.Errorf("http/dup: no %s", n)
		}
	}
}

func TestClientDuration(t *testing.T) {
	r, exp := newTest(t, Config{})
	c := span("HTTP POST", trace.SpanKindClient, "http_client", agentProc, 30*time.Millisecond,
		attribute.String("http.request.method", "POST"),
		attribute.String("url.full", "http://127.0.0.1:8002/verify"),
		attribute.String("server.address", "127.0.0.1"),
		attribute.Int("server.port", 8002),
		attribute.Int("http.response.status_code", 200))
	r.Observe([]spans.Span{c})
	d := flush(t, r, exp)["nemo-gym/simple_agent"][ClientDurationOld]
	a := attrsOf(t, d)
	if hist(t, d).Sum != 30 || a["net.peer.name"].AsString() != "127.0.0.1" || a["net.peer.port"].AsInt64() != 8002 ||
		a["http.status_code"].AsInt64() != 200 {
		t.Errorf("client duration %v attrs %v", hist(t, d).Sum, a)
	}
}

func TestSeriesCap(t *testing.T) {
	r, exp := newTest(t, Config{MaxSeries: 3})
	var batch []spans.Span
	for i := range 10 {
		batch = append(batch, serverSpan(resProc, "/item/"+string(rune('a'+i)), 200, time.Millisecond))
	}
	r.Observe(batch)
	d := flush(t, r, exp)["nemo-gym/simple_weather"][ServerDurationOld]
	h := d.Data.(metricdata.Histogram[float64])
	if len(h.DataPoints) != 4 {
		t.Fatalf("%d series, want 3 and the overflow one", len(h.DataPoints))
	}
	var over uint64
	for _, p := range h.DataPoints {
		if v, ok := p.Attributes.Value("otel.metric.overflow"); ok && v.AsBool() {
			over = p.Count
		}
	}
	if over != 7 || r.Stats().SeriesCapped != 7 {
		t.Errorf("overflow count %d, capped %d, want 7", over, r.Stats().SeriesCapped)
	}
}

func TestServersActive(t *testing.T) {
	var mu sync.Mutex
	n := 3
	r, exp := newTest(t, Config{Servers: func(pid int) int {
		if pid != orchProc.PID {
			t.Errorf("servers of %d", pid)
		}
		mu.Lock()
		defer mu.Unlock()
		return n
	}})
	r.Seen(agentProc) // not an orchestrator: no gauge, no provider
	r.Seen(orchProc)
	gauge := func() int64 {
		m := flush(t, r, exp)["nemo-gym/orchestrator"][ServersActive]
		g, ok := m.Data.(metricdata.Gauge[int64])
		if !ok || len(g.DataPoints) != 1 {
			t.Fatalf("servers.active %#v", m.Data)
		}
		return g.DataPoints[0].Value
	}
	if v := gauge(); v != 3 {
		t.Errorf("servers.active %d, want 3", v)
	}
	r.Gone(orchProc.PID)
	if v := gauge(); v != 0 {
		t.Errorf("servers.active %d after the orchestrator exited, want 0", v)
	}
	if st := r.Stats(); st.Processes != 1 {
		t.Errorf("%d processes, want the orchestrator alone", st.Processes)
	}
	r.Tick(time.Now().Add(time.Minute))
	if st := r.Stats(); st.Processes != 0 {
		t.Errorf("%d processes after the linger", st.Processes)
	}
}

func TestActiveRequests(t *testing.T) {
	var mu sync.Mutex
	inflight := 2
	r, exp := newTest(t, Config{Active: func(yield func(Active)) {
		mu.Lock()
		defer mu.Unlock()
		for range inflight {
			yield(Active{PID: uint32(resProc.PID), Method: "POST", Scheme: "http", Addr: "127.0.0.1", Port: 8001})
		}
	}})
	r.activeAge = 0 // every collection reads the builder
	r.Observe([]spans.Span{serverSpan(resProc, "/verify", 200, time.Millisecond)})
	value := func() int64 {
		m := flush(t, r, exp)["nemo-gym/simple_weather"][ServerActive]
		s, ok := m.Data.(metricdata.Sum[int64])
		if !ok || len(s.DataPoints) != 1 || s.IsMonotonic {
			t.Fatalf("active requests %#v", m.Data)
		}
		return s.DataPoints[0].Value
	}
	if v := value(); v != 2 {
		t.Errorf("active %d, want 2", v)
	}
	mu.Lock()
	inflight = 0
	mu.Unlock()
	if v := value(); v != 0 {
		t.Errorf("active %d when idle, want the series at 0", v)
	}
}

func TestPrometheusNames(t *testing.T) {
	r, _ := newTest(t, Config{})
	other := *resProc
	other.PID = 201 // a second worker of the same server: same metrics, same service.name
	r.Observe([]spans.Span{
		span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Second),
		verifySpan(1, true, false),
		serverSpan(resProc, "/verify", 200, time.Millisecond),
		serverSpan(&other, "/verify", 200, time.Millisecond),
	})
	fams, err := r.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, n := range []string{"gym_rollout_duration_ms_milliseconds", "gym_verify_duration_ms_milliseconds",
		"gym_verify_success_rate_ratio", "gym_verify_reward", "http_server_duration_milliseconds",
		"http_server_request_size_bytes", "http_server_response_size_bytes", "target_info"} {
		if byName[n] == nil {
			t.Errorf("no %s in %v", n, keys(byName))
		}
	}
	if f := byName["http_server_duration_milliseconds"]; f != nil && len(f.Metric) != 2 {
		t.Errorf("%d http_server_duration series, want one per process", len(f.Metric))
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Scrapes, periodic exports, spans and discovery all at once: no deadlock
// (the SDK collects under its own lock and runs the callbacks there) and no
// race (go test -race).
func TestConcurrentUse(t *testing.T) {
	r, exp := newTest(t, Config{Reward: true, Servers: func(int) int { return 2 },
		Active: func(yield func(Active)) { yield(Active{PID: uint32(resProc.PID), Method: "POST", Scheme: "http"}) }})
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
					r.Gather()
					r.ForceFlush(context.Background())
				}
			}
		}()
	}
	for i := range 300 {
		o := *orchProc
		o.PID = 1000 + i%7
		r.Seen(&o)
		r.Observe([]spans.Span{serverSpan(resProc, "/verify", 200, time.Millisecond), verifySpan(1, true, false),
			span("HTTP POST", trace.SpanKindClient, "http_client", &o, time.Millisecond)})
		if i%50 == 49 {
			r.Gone(o.PID)
			r.Tick(time.Now().Add(time.Hour))
		}
	}
	close(done)
	wg.Wait()
	if got := flush(t, r, exp)["nemo-gym/simple_weather"]; hist(t, got[VerifyDuration]).Count != 300 {
		t.Errorf("verify count %d, want 300", hist(t, got[VerifyDuration]).Count)
	}
}

// A process's spans that come after it exited (the builder releases held
// spans when it forgets a process) go into a provider that is dropped with
// it, not one that lives on.
func TestLateSpansAfterGone(t *testing.T) {
	r, _ := newTest(t, Config{Linger: time.Minute})
	r.Gone(agentProc.PID)
	r.Observe([]spans.Span{span("gym.rollout", trace.SpanKindInternal, "rollout", agentProc, time.Second)})
	if st := r.Stats(); st.Processes != 1 {
		t.Fatalf("%d processes", st.Processes)
	}
	r.Tick(time.Now().Add(2 * time.Minute))
	if st := r.Stats(); st.Processes != 0 {
		t.Errorf("%d processes after the linger: a late span kept a provider alive", st.Processes)
	}
}

// orderExporter records each export's service.name and the Shutdown, in
// order. An export whose context lacks closeKey (one not made by the
// Close under test) waits for Shutdown: a provider closed in the
// background then exports after the exporter was shut down, every time.
type orderExporter struct {
	memExporter
	shut   chan struct{}
	events []string
}

type closeKey struct{}

func (o *orderExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	if ctx.Value(closeKey{}) == nil {
		<-o.shut
	}
	v, _ := rm.Resource.Set().Value("service.name")
	o.mu.Lock()
	o.events = append(o.events, "export "+v.AsString())
	o.mu.Unlock()
	return nil
}

func (o *orderExporter) Shutdown(context.Context) error {
	o.mu.Lock()
	o.events = append(o.events, "shutdown")
	o.mu.Unlock()
	close(o.shut)
	return nil
}

// What gymtrace exports last for a process is its current provider's final
// values: a provider replaced when the process's identity changed (its
// server name learnt later) exports its last values before that, inside
// Close, never after the exporter has been shut down.
func TestCloseExportsReplacedFirst(t *testing.T) {
	exp := &orderExporter{shut: make(chan struct{})}
	r := New(Config{Exporter: exp, Resources: export.NewResources("host-a")})
	before := *resProc
	before.ServerName = "unnamed"
	r.Observe([]spans.Span{span("gym.verify", trace.SpanKindInternal, "verify", &before, time.Millisecond)})
	r.Observe([]spans.Span{verifySpan(1, true, false)}) // the same process, named now
	ctx := context.WithValue(context.Background(), closeKey{}, true)
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	exp.mu.Lock()
	got := slices.Clone(exp.events)
	exp.mu.Unlock()
	want := []string{"export nemo-gym/unnamed", "export nemo-gym/simple_weather", "shutdown"}
	if !slices.Equal(got, want) {
		t.Errorf("exports and shutdown %q, want %q", got, want)
	}
	// Measured after Close: nothing, and no provider made for it.
	r.Observe([]spans.Span{verifySpan(1, true, false)})
	if st := r.Stats(); st.Processes != 0 {
		t.Errorf("%d processes with metrics after Close", st.Processes)
	}
}
