package gymmetrics

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// TestStartupMetricsFromSpans: spawn-to-ready per server from each
// gym.startup.server span (the orchestrator's), each stage's duration from
// each gym.server.startup.<stage> span (the server's); gym.startup and the
// gym.server.startup parent measure nothing.
func TestStartupMetricsFromSpans(t *testing.T) {
	r, exp := newTest(t, Config{})
	name := attribute.String("nemo.gym.server.name", "simple_weather")
	typ := attribute.String("nemo.gym.server.type", "resources_servers")
	stage := func(st string, d time.Duration) spans.Span {
		return span("gym.server.startup."+st, trace.SpanKindInternal, "startup", resProc, d, name, typ,
			attribute.Int("process.pid", resProc.PID), attribute.String("nemo.gym.startup.stage", st))
	}
	r.Observe([]spans.Span{
		span("gym.startup", trace.SpanKindInternal, "startup", orchProc, 9*time.Second),
		span("gym.startup.server", trace.SpanKindInternal, "startup", orchProc, 4500*time.Millisecond, name, typ),
		span("gym.server.startup", trace.SpanKindInternal, "startup", resProc, 4*time.Second, name, typ),
		stage(spans.StageVenvSetup, 3*time.Second),
		stage(spans.StageInterpreterToListen, time.Second),
	})
	got := flush(t, r, exp)
	srv := hist(t, got["nemo-gym/orchestrator"][ServerStartupDuration])
	if srv.Count != 1 || srv.Sum != 4500 {
		t.Errorf("%s: count %d sum %v, want one of 4500 ms", ServerStartupDuration, srv.Count, srv.Sum)
	}
	for _, kv := range []attribute.KeyValue{name, typ} {
		if v, _ := srv.Attributes.Value(kv.Key); v != kv.Value {
			t.Errorf("%s: %s = %v, want %v", ServerStartupDuration, kv.Key, v, kv.Value)
		}
	}
	st, ok := got["nemo-gym/simple_weather"][StartupStageDuration].Data.(metricdata.Histogram[float64])
	if !ok || len(st.DataPoints) != 2 {
		t.Fatalf("%s: %#v, want a point per stage", StartupStageDuration, got["nemo-gym/simple_weather"][StartupStageDuration].Data)
	}
	by := map[string]float64{}
	for _, p := range st.DataPoints {
		v, _ := p.Attributes.Value("nemo.gym.startup.stage")
		n, _ := p.Attributes.Value("nemo.gym.server.name")
		if n.AsString() != "simple_weather" || p.Count != 1 || p.Attributes.Len() != 2 {
			t.Errorf("stage point %v count %d", p.Attributes, p.Count)
		}
		by[v.AsString()] = p.Sum
	}
	if by[spans.StageVenvSetup] != 3000 || by[spans.StageInterpreterToListen] != 1000 {
		t.Errorf("stages %v, want venv_setup 3000 and interpreter_to_listen 1000", by)
	}
}
