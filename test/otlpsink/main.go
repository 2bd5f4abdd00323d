// Command otlpsink is a real OTLP/gRPC trace and metrics receiver for
// gymtrace's tests.
//
// It serves the collector's own trace and metrics services (pdata's ptraceotlp
// and pmetricotlp, on one listener) so tests exercise the exporters against the
// same wire code a production OpenTelemetry Collector runs. It appends every
// received span to a file as one JSON object per line, and every metric data
// point to another. Each file is written once per Export request, before the
// request is answered, so a test that saw the exporter succeed can read what it
// sent at once.
//
// Usage:
//
//	otlpsink --listen 127.0.0.1:0 --out spans.jsonl [--metrics-out FILE] [--metrics-format points|otlp]
//	         [--http-listen 127.0.0.1:0] [--fail-for 2s] [--delay 200ms]
//
// The first line on stdout is "listening HOST:PORT"; with --http-listen (the
// OTLP/HTTP receiver: POST /v1/traces and /v1/metrics) the second is
// "listening-http HOST:PORT".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "otlpsink: %v\n", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, logger); err != nil {
		fmt.Fprintf(os.Stderr, "otlpsink: %v\n", err)
		os.Exit(1)
	}
}

type config struct {
	listen   string
	httpAddr string // --http-listen: also serve OTLP/HTTP here
	out      string
	metrics  string // metrics output file ("" with count: none)
	mformat  string // points or otlp
	failFor  time.Duration
	delay    time.Duration
	count    bool
	logLevel slog.Level
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("otlpsink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "address to serve OTLP/gRPC on (port 0 picks a free port)")
	fs.StringVar(&cfg.httpAddr, "http-listen", "", "also serve OTLP/HTTP (POST /v1/traces, /v1/metrics; protobuf or JSON, gzip or not) on this address (port 0 picks a free port); default none")
	fs.StringVar(&cfg.out, "out", "", "file to append received spans to, one JSON object per line (required)")
	fs.DurationVar(&cfg.failFor, "fail-for", 0, "answer UNAVAILABLE for this long after the first Export request, to simulate a collector outage")
	fs.DurationVar(&cfg.delay, "delay", 0, "wait this long before answering each Export request, to simulate a slow collector")
	fs.StringVar(&cfg.metrics, "metrics-out", "", "file to append received metric data points to, one JSON line each (default: --out's name with its extension replaced by .metrics.jsonl; none with --count-only)")
	fs.StringVar(&cfg.mformat, "metrics-format", "points", "metrics output: points (one flat JSON object per data point) or otlp (one OTLP/JSON ExportMetricsServiceRequest per line, pmetric's JSONMarshaler)")
	fs.BoolVar(&cfg.count, "count-only", false, "accept and count spans but write none (--out not needed): for capacity runs, where the sink should cost no more than a collector's receiver")
	verbose := fs.Bool("v", false, "log every Export request on stderr")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q: all options are flags, see --help", fs.Args())
	}
	if cfg.out == "" && !cfg.count {
		return cfg, errors.New("--out FILE is required: it is where received spans are written (or --count-only)")
	}
	if cfg.mformat != "points" && cfg.mformat != "otlp" {
		return cfg, fmt.Errorf("--metrics-format %q: want points or otlp", cfg.mformat)
	}
	if cfg.metrics == "" && cfg.out != "" && !cfg.count {
		cfg.metrics = defaultMetricsOut(cfg.out)
	}
	if cfg.metrics != "" && filepath.Clean(cfg.metrics) == filepath.Clean(cfg.out) {
		return cfg, errors.New("--metrics-out must not be the --out file")
	}
	if cfg.failFor < 0 || cfg.delay < 0 {
		return cfg, errors.New("--fail-for and --delay must not be negative")
	}
	cfg.logLevel = slog.LevelWarn
	if *verbose {
		cfg.logLevel = slog.LevelInfo
	}
	return cfg, nil
}

// defaultMetricsOut is where metrics go without --metrics-out: next to the
// spans, spans.jsonl -> spans.metrics.jsonl.
func defaultMetricsOut(out string) string {
	return strings.TrimSuffix(out, filepath.Ext(out)) + ".metrics.jsonl"
}

// run serves until ctx is cancelled. The "listening" line is written to stdout
// only once the socket is bound, so a caller may connect as soon as it reads it.
func run(ctx context.Context, cfg config, stdout io.Writer, logger *slog.Logger) error {
	var out io.Writer
	if !cfg.count {
		f, err := os.OpenFile(cfg.out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("opening output file: %w", err)
		}
		defer f.Close()
		out = f
	}

	opts := sinkOptions{failFor: cfg.failFor, delay: cfg.delay, logger: logger, metricsFormat: cfg.mformat, httpListen: cfg.httpAddr}
	if cfg.metrics != "" {
		// Created now, so a test finds the file (empty) before any export.
		f, err := os.OpenFile(cfg.metrics, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("opening metrics output file: %w", err)
		}
		defer f.Close()
		opts.metricsOut = f
	}
	s, err := newSink(cfg.listen, out, opts)
	if err != nil {
		return err
	}
	lines := fmt.Sprintf("listening %s\n", s.Addr())
	if a := s.HTTPAddr(); a != nil {
		lines += fmt.Sprintf("listening-http %s\n", a)
	}
	if _, err := io.WriteString(stdout, lines); err != nil {
		s.Stop()
		return fmt.Errorf("writing the listening line: %w", err)
	}
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}

	errc := make(chan error, 1)
	go func() { errc <- s.Serve() }()
	select {
	case <-ctx.Done():
		s.Stop()
		<-errc
		st := s.Stats()
		logger.Info("otlpsink stopped", "requests", st.Requests, "rejected", st.Rejected, "spans", st.Spans, "resent", st.Resent,
			"metric_requests", st.MetricRequests, "metric_rejected", st.MetricRejected, "data_points", st.DataPoints)
		return nil
	case err := <-errc:
		return err
	}
}
