package export

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// receiver is a real OTLP/gRPC trace receiver on loopback: the SDK exporter
// talks real gRPC to it. It can be stopped and started again on the same
// port to play a collector outage.
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	t    *testing.T
	addr string

	mu    sync.Mutex
	got   []*tracepb.ResourceSpans
	calls int
	delay time.Duration
	srv   *grpc.Server
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{t: t}
	r.start()
	t.Cleanup(r.stop)
	return r
}

// reservePort returns a loopback address nothing listens on (yet).
func reservePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func (r *receiver) start() {
	r.t.Helper()
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	// The port was ours a moment ago; allow the kernel a little time to free it.
	for i := 0; i < 50; i++ {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.t.Fatalf("receiver listen on %s: %v", addr, err)
	}
	r.addr = l.Addr().String()
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, r)
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go srv.Serve(l)
}

func (r *receiver) stop() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

func (r *receiver) setDelay(d time.Duration) {
	r.mu.Lock()
	r.delay = d
	r.mu.Unlock()
}

func (r *receiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	d := r.delay
	r.calls++
	r.mu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	r.mu.Lock()
	r.got = append(r.got, req.ResourceSpans...)
	r.mu.Unlock()
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// spans returns every received span with its resource's attributes.
func (r *receiver) spans() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []receivedSpan
	for _, rs := range r.got {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.Key] = anyValueString(kv.Value)
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				out = append(out, receivedSpan{span: s, resource: res, scope: ss.GetScope().GetName()})
			}
		}
	}
	return out
}

type receivedSpan struct {
	span     *tracepb.Span
	resource map[string]string
	scope    string
}

func (r *receiver) count() int { return len(r.spans()) }

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
