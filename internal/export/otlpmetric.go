package export

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// NewOTLPMetrics makes the OTel Go SDK's OTLP/gRPC metric exporter for the
// endpoint, headers and timeout traces use. The SDK reads the rest from the
// standard environment (OTEL_EXPORTER_OTLP_METRICS_*, among them
// OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE: cumulative, delta or
// lowmemory). Like NewOTLP it does not wait for the endpoint.
func NewOTLPMetrics(ctx context.Context, cfg OTLPConfig) (sdkmetric.Exporter, error) {
	ep, err := parseEndpoint(cfg)
	if err != nil {
		return nil, err
	}
	opts := []otlpmetricgrpc.Option{
		otlpmetricgrpc.WithDialOption(reconnect),
		// The values are cumulative by default, so the next export carries
		// what a failed one had; the SDK's retry would hold a reader (and
		// gymtrace's exit) for up to a minute.
		otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{Enabled: false}),
	}
	switch {
	case ep.url != "":
		opts = append(opts, otlpmetricgrpc.WithEndpointURL(ep.url))
	case ep.hostPort != "":
		opts = append(opts, otlpmetricgrpc.WithEndpoint(ep.hostPort))
	}
	if ep.insecure {
		opts = append(opts, otlpmetricgrpc.WithInsecure())
	}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlpmetricgrpc.WithHeaders(cfg.Headers))
	}
	if cfg.Timeout > 0 {
		opts = append(opts, otlpmetricgrpc.WithTimeout(cfg.Timeout))
	}
	e, err := otlpmetricgrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("starting the OTLP/gRPC metric exporter: %w", err)
	}
	return e, nil
}
