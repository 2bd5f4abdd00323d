//go:build linux

package agent

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/gymmetrics"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// metricSink is an OTLP metric exporter that hands every export to the test.
type metricSink struct {
	got chan metricdata.ResourceMetrics
}

func (m *metricSink) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}
func (m *metricSink) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}
func (m *metricSink) Export(_ context.Context, rm *metricdata.ResourceMetrics) error {
	m.got <- *rm
	return nil
}
func (m *metricSink) ForceFlush(context.Context) error { return nil }
func (m *metricSink) Shutdown(context.Context) error   { return nil }

// spanSink keeps the exported spans.
type spanSink struct {
	mu    sync.Mutex
	spans []spans.Span
}

func (s *spanSink) Export(_ context.Context, b []spans.Span) error {
	s.mu.Lock()
	s.spans = append(s.spans, b...)
	s.mu.Unlock()
	return nil
}
func (s *spanSink) Shutdown(context.Context) error { return nil }

// gatedCloser is a probe whose detach waits until the test opens gate.
type gatedCloser struct{ gate chan struct{} }

func (g gatedCloser) Close() error { <-g.gate; return nil }

func verifyCount(rm metricdata.ResourceMetrics) uint64 {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == gymmetrics.VerifyDuration {
				for _, p := range h.DataPoints {
					return p.Count
				}
			}
		}
	}
	return 0
}

// At SIGTERM the last spans and Gym's metrics are flushed and exported
// while the probes are still coming off, not after: detaching takes the
// kernel seconds under load, and a gymtrace killed meanwhile (a test's
// bound, Kubernetes' grace period) lost what waited to be flushed. Here
// the last /verify before the signal is still waiting for its client's
// record (a late join) and a probe's detach never ends until the test says
// so: the final metric export must count that /verify all the same.
func TestStopExportsBeforeProbesAreOff(t *testing.T) {
	const pid = 400
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mask := groups.Server.Mask() | groups.Verify.Mask() | groups.HTTPClient.Mask() // a client record may come: the /verify waits
	a := &agent{log: log, procs: map[int]*discover.Process{
		pid: {PID: pid, Role: loader.RoleResources, ServerName: "weather", StartTime: 1},
	}}
	clock, err := http.NewClock()
	if err != nil {
		t.Fatal(err)
	}
	b, err := spans.NewBuilder(spans.Options{Mask: mask, Lookup: a.lookup, Unsampled: true, Clock: clock, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	a.spans = spans.NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
	out := &spanSink{}
	a.out = export.NewPipeline(out, export.PipelineConfig{Logger: log})
	metrics := &metricSink{got: make(chan metricdata.ResourceMetrics, 16)}
	a.gym = gymmetrics.New(gymmetrics.Config{Exporter: metrics, Resources: export.NewResources("host-a"), Log: log})
	a.py = newPyTargets(a, mask)
	a.detached = newCloser(log)
	gate := make(chan struct{})
	a.detached.add([]io.Closer{gatedCloser{gate}})

	// POST /verify on a loopback connection followed from its first byte,
	// answered; its client's record has not been read.
	now := clock.NowMono()
	ev := func(kind uint8, at uint64) *loader.HTTPEvent {
		e := &loader.HTTPEvent{Kind: kind, Side: loader.SideServer, Pid: pid, Tid: pid, ConnId: 7,
			StartNs: at, EndNs: at + 1000, Role: loader.RoleResources, Groups: uint64(mask)}
		srv, cli := netip.MustParseAddrPort("127.0.0.1:8003"), netip.MustParseAddrPort("127.0.0.1:40001")
		e.Tuple.Laddr, e.Tuple.Raddr = srv.Addr().As16(), cli.Addr().As16()
		e.Tuple.Family, e.Tuple.Lport, e.Tuple.Rport = 2, srv.Port(), cli.Port()
		return e
	}
	req := ev(loader.EvRequest, now)
	req.Method, req.Flags = loader.MethodPOST, loader.FlagFresh
	req.PathLen = uint16(copy(req.Path[:], "/verify"))
	resp := ev(loader.EvResponse, now+2000)
	resp.Status = 200
	a.submit(a.spans.ProcessEvent(req))
	a.submit(a.spans.ProcessEvent(resp))
	if st := b.Stats(); st.AwaitedClient != 1 || st.LateExpired != 0 {
		t.Fatalf("the /verify is not waiting for its client (awaited %d, expired %d): the test proves nothing",
			st.AwaitedClient, st.LateExpired)
	}

	done := make(chan struct{})
	var feeders, others sync.WaitGroup
	go func() { defer close(done); a.finish(&feeders, &others) }()
	// A generous bound on a hang, not a measure of speed.
	bound := time.After(60 * time.Second)
	for counted := false; !counted; {
		select {
		case rm := <-metrics.got:
			counted = verifyCount(rm) == 1
		case <-bound:
			close(gate)
			t.Fatal("no metric export counted the last /verify while a probe was still being detached: " +
				"the flush and the final export wait for the probes")
		}
	}
	close(gate)
	<-done
	out.mu.Lock()
	defer out.mu.Unlock()
	if len(out.spans) != 2 { // POST /verify and gym.verify
		t.Errorf("%d spans exported at the stop, want the /verify's SERVER span and its gym.verify", len(out.spans))
	}
}
