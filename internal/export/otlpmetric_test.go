package export

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The metric exporter takes the trace endpoint's settings and leaves the
// temporality to OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE.
func TestOTLPMetricsTemporality(t *testing.T) {
	for pref, want := range map[string]metricdata.Temporality{
		"":           metricdata.CumulativeTemporality,
		"delta":      metricdata.DeltaTemporality,
		"LowMemory":  metricdata.DeltaTemporality,
		"cumulative": metricdata.CumulativeTemporality,
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", pref)
		e, err := NewOTLPMetrics(context.Background(), OTLPConfig{Endpoint: "127.0.0.1:4317", Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Temporality(sdkmetric.InstrumentKindHistogram); got != want {
			t.Errorf("preference %q: histograms %v, want %v", pref, got, want)
		}
		// Up-down counters (active requests) stay cumulative in every mode.
		if got := e.Temporality(sdkmetric.InstrumentKindObservableUpDownCounter); got != metricdata.CumulativeTemporality {
			t.Errorf("preference %q: up-down counters %v", pref, got)
		}
		e.Shutdown(context.Background())
	}
	if _, err := NewOTLPMetrics(context.Background(), OTLPConfig{Endpoint: "ftp://x:1"}); err == nil {
		t.Error("an ftp:// endpoint was accepted")
	}
}
