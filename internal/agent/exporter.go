//go:build linux

package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/spans"
)

func sampler(ratio float64) sdktrace.Sampler {
	if ratio >= 1 {
		return nil
	}
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
}

func newExporter(ctx context.Context, cfg *config.Config, term io.Writer, log *slog.Logger) (export.Exporter, error) {
	res := export.NewResources("")
	switch cfg.Exporter {
	case config.ExporterOTLP:
		e, err := export.NewOTLP(ctx, export.OTLPConfig{
			Endpoint:  cfg.OTLPEndpoint,
			Insecure:  cfg.OTLPInsecure,
			Headers:   cfg.OTLPHeaders,
			Timeout:   cfg.OTLPTimeout,
			Resources: res,
		})
		if err != nil {
			return nil, fmt.Errorf("setting up the OTLP exporter: %w", err)
		}
		return e, nil
	case config.ExporterJSONL:
		e, err := export.OpenJSONL(cfg.Output, res)
		if err != nil {
			return nil, err
		}
		return e, nil
	default:
		w := term
		if cfg.Output != "" && cfg.Output != "-" {
			f, err := os.OpenFile(cfg.Output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return nil, fmt.Errorf("opening %s for the trace tree: %w", cfg.Output, err)
			}
			w = f
		}
		return export.NewTree(w, export.TreeConfig{Logger: log.With("component", "tree")}), nil
	}
}

func (t *agent) submit(s []spans.Span) {
	if s = t.observe(s); len(s) > 0 {
		t.out.Submit(s...)
	}
}
