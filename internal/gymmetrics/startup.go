package gymmetrics

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// Server startup histograms (the startup group; docs/startup.md), from the
// startup spans: a gym.startup.server span is one server's spawn to its
// first answer, a gym.server.startup.<stage> span one stage of it.
const (
	ServerStartupDuration = "gym.server.startup_duration_ms"
	StartupStageDuration  = "gym.server.startup.stage_duration_ms"
)

// Startups take seconds to minutes (a venv built from scratch): the SDK's
// default boundaries stop at 10 s.
var startupBuckets = []float64{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000, 600000}

type startupInst struct {
	server, stage metric.Float64Histogram
}

func newStartupInst(m metric.Meter) startupInst {
	var s startupInst
	s.server, _ = m.Float64Histogram(ServerStartupDuration, metric.WithUnit("ms"),
		metric.WithDescription("Time from the fork of a server's launch shell to the first request the server answered"),
		metric.WithExplicitBucketBoundaries(startupBuckets...))
	s.stage, _ = m.Float64Histogram(StartupStageDuration, metric.WithUnit("ms"),
		metric.WithDescription("Duration of one stage of a server's startup (venv_setup, interpreter_to_listen)"),
		metric.WithExplicitBucketBoundaries(startupBuckets...))
	return s
}

// isStartupServer and isStartupStage tell measureKind which spans these are.
func isStartupServer(s *spans.Span) bool {
	return s.Group == "startup" && s.Name == "gym.startup.server"
}

func isStartupStage(s *spans.Span) bool {
	return s.Group == "startup" && strings.HasPrefix(s.Name, "gym.server.startup.")
}

// measureStartup records one startup span with the attributes the span
// carries: server name and type for the whole, server name and stage for a
// stage. gym.startup.server is the orchestrator's span, so its series are in
// the orchestrator's provider; a stage's are in the server's.
func (r *Recorder) measureStartup(pr *proc, s *spans.Span, stage bool) {
	var name, typ, stg string
	for _, kv := range s.Attrs {
		switch kv.Key {
		case "nemo.gym.server.name":
			name = kv.Value.AsString()
		case "nemo.gym.server.type":
			typ = kv.Value.AsString()
		case "nemo.gym.startup.stage":
			stg = kv.Value.AsString()
		}
	}
	d := ms(s.End.Sub(s.Start))
	if stage {
		pr.st.stage.Record(context.Background(), d, metric.WithAttributeSet(r.attrSet(pr, StartupStageDuration,
			[]attribute.KeyValue{attribute.String("nemo.gym.server.name", name), attribute.String("nemo.gym.startup.stage", stg)})))
		return
	}
	pr.st.server.Record(context.Background(), d, metric.WithAttributeSet(r.attrSet(pr, ServerStartupDuration,
		[]attribute.KeyValue{attribute.String("nemo.gym.server.name", name), attribute.String("nemo.gym.server.type", typ)})))
}
