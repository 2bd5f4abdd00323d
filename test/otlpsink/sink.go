package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // exporters may send gzip (OTEL_EXPORTER_OTLP_COMPRESSION=gzip)
	"google.golang.org/grpc/status"
)

// Span is one line of the output file. Field names follow gymtrace's own jsonl
// exporter so the same test helpers read both.
type Span struct {
	Name              string         `json:"name"`
	Kind              string         `json:"kind"`
	TraceID           string         `json:"trace_id"`
	SpanID            string         `json:"span_id"`
	ParentSpanID      string         `json:"parent_span_id"`
	StartTimeUnixNano uint64         `json:"start_time_unix_nano"`
	EndTimeUnixNano   uint64         `json:"end_time_unix_nano"`
	Attributes        map[string]any `json:"attributes"`
	Resource          map[string]any `json:"resource"`
	Status            Status         `json:"status"`
	Links             []Link         `json:"links"`
	Scope             string         `json:"scope"`
}

// Status is the span status; Code is UNSET, OK or ERROR.
type Status struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Link is a span link.
type Link struct {
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Attributes map[string]any `json:"attributes"`
}

// Stats counts what the sink has seen.
type Stats struct {
	Requests int64 // trace Export requests answered OK
	Rejected int64 // trace Export requests answered UNAVAILABLE (--fail-for)
	Spans    int64 // spans written
	Resent   int64 // spans received again, byte for byte (an exporter's retry), not written again

	MetricRequests int64 // metrics Export requests answered OK
	MetricRejected int64 // metrics Export requests answered UNAVAILABLE (--fail-for)
	DataPoints     int64 // metric data points received (written, unless counting only)
}

type sinkOptions struct {
	failFor time.Duration
	delay   time.Duration
	logger  *slog.Logger

	metricsOut    io.Writer // nil: count data points, write none
	metricsFormat string    // "points" (default) or "otlp"

	httpListen string // also serve OTLP/HTTP here (--http-listen); "" none
}

type sink struct {
	ptraceotlp.UnimplementedGRPCServer

	lis  net.Listener
	srv  *grpc.Server
	http *httpReceiver // nil without --http-listen
	opts sinkOptions

	mu   sync.Mutex        // serialises writes so concurrent requests never interleave lines
	out  io.Writer         // nil: count spans, write none (--count-only)
	seen map[[16]byte]bool // under mu: every span line written (see Export)

	metricsMu sync.Mutex // the same for the metrics output
	exports   int64      // metrics Export requests written, under metricsMu

	firstOnce sync.Once
	firstAt   atomic.Int64 // unix nanos of the first Export request, traces or metrics

	requests, rejected, spans, resent          atomic.Int64
	metricRequests, metricRejected, dataPoints atomic.Int64
}

func newSink(listen string, out io.Writer, opts sinkOptions) (*sink, error) {
	if opts.logger == nil {
		opts.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("listening on %s (use --listen HOST:PORT, port 0 for any free port): %w", listen, err)
	}
	s := &sink{lis: lis, out: out, opts: opts, seen: map[[16]byte]bool{}}
	// The collector's OTLP receiver accepts large batches; the gRPC default of
	// 4 MiB would reject a big exporter batch that a real collector takes.
	s.srv = grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	ptraceotlp.RegisterGRPCServer(s.srv, s)
	pmetricotlp.RegisterGRPCServer(s.srv, &metricsService{s: s})
	if opts.httpListen != "" {
		h, err := newHTTPReceiver(s, opts.httpListen)
		if err != nil {
			lis.Close()
			return nil, err
		}
		s.http = h
	}
	return s, nil
}

func (s *sink) Addr() net.Addr { return s.lis.Addr() }

// HTTPAddr is the OTLP/HTTP listener's address, nil without one.
func (s *sink) HTTPAddr() net.Addr {
	if s.http == nil {
		return nil
	}
	return s.http.lis.Addr()
}

// Serve serves gRPC, and OTLP/HTTP when configured, until Stop; the first
// listener to fail ends it.
func (s *sink) Serve() error {
	errc := make(chan error, 2)
	n := 1
	if s.http != nil {
		n++
		go func() { errc <- s.http.serve() }()
	}
	go func() {
		if err := s.srv.Serve(s.lis); err != nil && err != grpc.ErrServerStopped {
			errc <- fmt.Errorf("serving OTLP/gRPC: %w", err)
			return
		}
		errc <- nil
	}()
	var first error
	for i := 0; i < n; i++ {
		if err := <-errc; err != nil && first == nil {
			first = err
			s.Stop()
		}
	}
	return first
}

// Stop waits briefly for in-flight requests so their spans reach the file.
func (s *sink) Stop() {
	if s.http != nil {
		s.http.stop()
	}
	done := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		s.srv.Stop()
	}
}

func (s *sink) Stats() Stats {
	return Stats{Requests: s.requests.Load(), Rejected: s.rejected.Load(), Spans: s.spans.Load(), Resent: s.resent.Load(),
		MetricRequests: s.metricRequests.Load(), MetricRejected: s.metricRejected.Load(), DataPoints: s.dataPoints.Load()}
}

// admit applies --fail-for and --delay to one Export request of either
// service: a nil error means go on and store it. rejected is that service's
// counter of UNAVAILABLE answers.
func (s *sink) admit(ctx context.Context, rejected *atomic.Int64, what string, n int) error {
	now := time.Now()
	s.firstOnce.Do(func() { s.firstAt.Store(now.UnixNano()) })
	if s.opts.failFor > 0 && now.Sub(time.Unix(0, s.firstAt.Load())) < s.opts.failFor {
		rejected.Add(1)
		s.opts.logger.Info("export rejected (--fail-for)", what, n)
		return status.Error(codes.Unavailable, "otlpsink: simulated outage (--fail-for)")
	}
	if s.opts.delay > 0 {
		t := time.NewTimer(s.opts.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

// Export implements the OTLP trace service.
func (s *sink) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	if err := s.admit(ctx, &s.rejected, "spans", req.Traces().SpanCount()); err != nil {
		return ptraceotlp.NewExportResponse(), err
	}

	if s.out == nil { // --count-only
		n := req.Traces().SpanCount()
		s.requests.Add(1)
		s.spans.Add(int64(n))
		return ptraceotlp.NewExportResponse(), nil
	}
	buf, err := encodeTraces(req.Traces())
	if err != nil {
		return ptraceotlp.NewExportResponse(), status.Errorf(codes.Internal, "otlpsink: encoding spans: %v", err)
	}
	s.mu.Lock()
	buf, n, again := s.fresh(buf)
	_, err = s.out.Write(buf)
	s.mu.Unlock()
	if err != nil {
		s.opts.logger.Error("writing spans failed", "err", err)
		return ptraceotlp.NewExportResponse(), status.Errorf(codes.Internal, "otlpsink: writing spans: %v", err)
	}
	s.requests.Add(1)
	s.spans.Add(int64(n))
	s.resent.Add(int64(again))
	s.opts.logger.Info("export received", "spans", n, "resent", again)
	return ptraceotlp.NewExportResponse(), nil
}

// fresh drops from buf (span lines) the lines written before: OTLP export
// is at least once, and an exporter whose request timed out after the sink
// had stored it sends the same batch again (a kernel-matrix guest under
// software emulation: 83 spans twice, CI of 65c3a2b). A backend stores a
// span once; so does the sink, or each test would count a retry as a second
// span. Only a byte-identical line is a resend: two different spans with one
// id (an exporter's bug) are both written. Call with s.mu held.
func (s *sink) fresh(buf []byte) (out []byte, n, again int) {
	out = buf[:0:0]
	for len(buf) > 0 {
		i := bytes.IndexByte(buf, '\n') + 1
		if i == 0 {
			i = len(buf)
		}
		line := buf[:i]
		buf = buf[i:]
		sum := sha256.Sum256(line)
		key := [16]byte(sum[:16])
		if s.seen[key] {
			again++
			continue
		}
		s.seen[key] = true
		out = append(out, line...)
		n++
	}
	return out, n, again
}

// encodeTraces renders every span as one JSON line; the result is written with
// a single Write so a reader never sees half a request.
func encodeTraces(td ptrace.Traces) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		res := rs.Resource().Attributes().AsRaw()
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j)
			scope := ss.Scope().Name()
			spans := ss.Spans()
			for k := 0; k < spans.Len(); k++ {
				if err := enc.Encode(convertSpan(spans.At(k), res, scope)); err != nil {
					return nil, err
				}
			}
		}
	}
	return buf.Bytes(), nil
}

func convertSpan(sp ptrace.Span, res map[string]any, scope string) Span {
	out := Span{
		Name:              sp.Name(),
		Kind:              kindName(sp.Kind()),
		TraceID:           traceID(sp.TraceID()),
		SpanID:            spanID(sp.SpanID()),
		ParentSpanID:      spanID(sp.ParentSpanID()),
		StartTimeUnixNano: uint64(sp.StartTimestamp()),
		EndTimeUnixNano:   uint64(sp.EndTimestamp()),
		Attributes:        sp.Attributes().AsRaw(),
		Resource:          res,
		Status:            Status{Code: statusName(sp.Status().Code()), Message: sp.Status().Message()},
		Links:             []Link{},
		Scope:             scope,
	}
	links := sp.Links()
	for i := 0; i < links.Len(); i++ {
		l := links.At(i)
		out.Links = append(out.Links, Link{
			TraceID:    traceID(l.TraceID()),
			SpanID:     spanID(l.SpanID()),
			Attributes: l.Attributes().AsRaw(),
		})
	}
	return out
}

func traceID(id pcommon.TraceID) string {
	if id.IsEmpty() {
		return ""
	}
	return hex.EncodeToString(id[:])
}

func spanID(id pcommon.SpanID) string {
	if id.IsEmpty() {
		return ""
	}
	return hex.EncodeToString(id[:])
}

func kindName(k ptrace.SpanKind) string {
	switch k {
	case ptrace.SpanKindServer:
		return "SERVER"
	case ptrace.SpanKindClient:
		return "CLIENT"
	case ptrace.SpanKindInternal:
		return "INTERNAL"
	case ptrace.SpanKindProducer:
		return "PRODUCER"
	case ptrace.SpanKindConsumer:
		return "CONSUMER"
	default:
		return "UNSPECIFIED"
	}
}

func statusName(c ptrace.StatusCode) string {
	switch c {
	case ptrace.StatusCodeOk:
		return "OK"
	case ptrace.StatusCodeError:
		return "ERROR"
	default:
		return "UNSET"
	}
}
