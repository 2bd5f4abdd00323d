package export

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/spans"
)

func anyValueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

var (
	agentProc = &discover.Process{PID: 4242, NSPID: 7, Role: roleAgent, ServerName: "simple_agent", Comm: "python",
		ContainerID: "abc123", K8sPodName: "gym-0", K8sNamespace: "rl", K8sNodeName: "gpu-node-1"}
	modelProc = &discover.Process{PID: 4343, NSPID: 4343, Role: roleModel, ServerName: "policy_model", Comm: "python"}
	anonProc  = &discover.Process{PID: 4444, Comm: "uvicorn"}
)

func tid(s string) trace.TraceID {
	var id trace.TraceID
	b, _ := hex.DecodeString(s)
	copy(id[:], b)
	return id
}

func sid(s string) trace.SpanID {
	var id trace.SpanID
	b, _ := hex.DecodeString(s)
	copy(id[:], b)
	return id
}

// testSpans: an agent server span (root), its client span, and the model's
// server span, in two processes.
func testSpans(base time.Time) []spans.Span {
	t1 := tid("4bf92f3577b34da6a3ce929d0e0e4736")
	return []spans.Span{
		{
			Name: "POST /v1/responses", Kind: trace.SpanKindServer, TraceID: t1, SpanID: sid("00f067aa0ba902b7"),
			Parent: sid("1111111111111111"), Start: base.Add(10 * time.Millisecond), End: base.Add(90 * time.Millisecond),
			Attrs: []attribute.KeyValue{
				attribute.String("http.request.method", "POST"), attribute.String("http.route", "/v1/responses"),
				attribute.Int("http.response.status_code", 200),
				attribute.String("http.request.header.authorization", "Bearer sk-SECRET"),
				attribute.String("Cookie", "session=SECRET"),
			},
			Status: codes.Unset, Group: "server", Proc: modelProc,
		},
		{
			Name: "HTTP POST", Kind: trace.SpanKindClient, TraceID: t1, SpanID: sid("1111111111111111"),
			Parent: sid("2222222222222222"), Start: base.Add(5 * time.Millisecond), End: base.Add(95 * time.Millisecond),
			Attrs: []attribute.KeyValue{
				attribute.String("url.full", "http://127.0.0.1:8002/v1/responses?token=SECRET"),
				attribute.Int("http.response.status_code", 200),
			},
			Group: "http_client", Proc: agentProc,
		},
		{
			Name: "POST /run", Kind: trace.SpanKindServer, TraceID: t1, SpanID: sid("2222222222222222"),
			Start: base, End: base.Add(100 * time.Millisecond),
			Attrs:  []attribute.KeyValue{attribute.Int("http.response.status_code", 500)},
			Status: codes.Error, StatusMsg: "HTTP 500", Group: "server", Proc: agentProc,
		},
		{
			Name: "GET /", Kind: trace.SpanKindServer, TraceID: tid("0af7651916cd43dd8448eb211c80319c"),
			SpanID: sid("3333333333333333"), Start: base, End: base.Add(time.Millisecond), Group: "server", Proc: anonProc,
		},
	}
}

func TestOTLPDeliversGymtraceIdsTimesAndResources(t *testing.T) {
	rcv := newReceiver(t)
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{Endpoint: "http://" + rcv.addr, Resources: NewResources("node-a")})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(ctx)

	base := time.Unix(1_700_000_000, 123456789)
	in := testSpans(base)
	if err := exp.Export(ctx, in); err != nil {
		t.Fatalf("export: %v", err)
	}
	got := rcv.spans()
	if len(got) != len(in) {
		t.Fatalf("received %d spans, want %d", len(got), len(in))
	}
	byID := map[string]receivedSpan{}
	for _, g := range got {
		byID[hex.EncodeToString(g.span.SpanId)] = g
	}
	for _, s := range in {
		g, ok := byID[s.SpanID.String()]
		if !ok {
			t.Fatalf("span %s (%s) not received", s.Name, s.SpanID)
		}
		p := g.span
		if hex.EncodeToString(p.TraceId) != s.TraceID.String() {
			t.Errorf("%s: trace id %x, want %s", s.Name, p.TraceId, s.TraceID)
		}
		wantParent := ""
		if s.Parent.IsValid() {
			wantParent = s.Parent.String()
		}
		if hex.EncodeToString(p.ParentSpanId) != wantParent {
			t.Errorf("%s: parent %x, want %q", s.Name, p.ParentSpanId, wantParent)
		}
		if p.StartTimeUnixNano != uint64(s.Start.UnixNano()) || p.EndTimeUnixNano != uint64(s.End.UnixNano()) {
			t.Errorf("%s: times %d..%d, want %d..%d", s.Name, p.StartTimeUnixNano, p.EndTimeUnixNano, s.Start.UnixNano(), s.End.UnixNano())
		}
		if p.Name != s.Name {
			t.Errorf("name %q, want %q", p.Name, s.Name)
		}
		if g.scope != "gymtrace" {
			t.Errorf("scope %q, want gymtrace", g.scope)
		}
		if g.resource["service.name"] != ServiceName(s.Proc) || g.resource["host.name"] != "node-a" ||
			g.resource["process.pid"] != strconv.Itoa(s.Proc.PID) {
			t.Errorf("%s: resource %v", s.Name, g.resource)
		}
		for _, kv := range p.Attributes {
			v := anyValueString(kv.Value)
			if kv.Key == "http.request.header.authorization" || kv.Key == "Cookie" || strings.Contains(v, "SECRET") {
				t.Errorf("%s: secret attribute reached the collector: %s=%s", s.Name, kv.Key, v)
			}
		}
	}

	agent := byID["2222222222222222"]
	want := map[string]string{
		"service.name": "nemo-gym/simple_agent", "nemo.gym.server.name": "simple_agent",
		"nemo.gym.server.type": "responses_api_agents", "process.pid": "4242", "container.id": "abc123",
		"k8s.pod.name": "gym-0", "k8s.namespace.name": "rl", "k8s.node.name": "gpu-node-1", "host.name": "node-a",
	}
	for k, v := range want {
		if agent.resource[k] != v {
			t.Errorf("agent resource %s = %q, want %q", k, agent.resource[k], v)
		}
	}
	if agent.span.Kind != tracepb.Span_SPAN_KIND_SERVER || agent.span.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		agent.span.Status.GetMessage() != "HTTP 500" {
		t.Errorf("agent span kind/status: %v %v", agent.span.Kind, agent.span.Status)
	}
	if c := byID["1111111111111111"]; c.span.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("client kind %v", c.span.Kind)
	}
	if m := byID["00f067aa0ba902b7"].resource; m["nemo.gym.server.type"] != "responses_api_models" || m["container.id"] != "" {
		t.Errorf("model resource %v", m)
	}
	if a := byID["3333333333333333"].resource; a["service.name"] != "nemo-gym/uvicorn" || a["nemo.gym.server.type"] != "" {
		t.Errorf("unknown process resource %v", a)
	}
}

// The standard variables configure the exporter when no option is given.
func TestOTLPHonoursOTELEnv(t *testing.T) {
	rcv := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.addr)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=gym")
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(ctx)
	if err := exp.Export(ctx, testSpans(time.Now())[:1]); err != nil {
		t.Fatalf("export via OTEL_EXPORTER_OTLP_ENDPOINT: %v", err)
	}
	if rcv.count() != 1 {
		t.Fatalf("received %d spans", rcv.count())
	}
}

func TestOTLPInsecureEnvWithBareHostPort(t *testing.T) {
	rcv := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{Endpoint: rcv.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(ctx)
	if err := exp.Export(ctx, testSpans(time.Now())[:1]); err != nil {
		t.Fatalf("export to bare host:port with OTEL_EXPORTER_OTLP_INSECURE: %v", err)
	}
}

// https:// means TLS: a plaintext receiver must not get the spans.
func TestOTLPHTTPSMeansTLS(t *testing.T) {
	rcv := newReceiver(t)
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{Endpoint: "https://" + rcv.addr, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(ctx)
	if err := exp.Export(ctx, testSpans(time.Now())[:1]); err == nil {
		t.Fatal("TLS export to a plaintext receiver succeeded")
	}
}

func TestOTLPBadEndpointIsAReadableError(t *testing.T) {
	for _, ep := range []string{"ftp://x:1", "http://", "just-a-host", "host:"} {
		_, err := NewOTLP(context.Background(), OTLPConfig{Endpoint: ep})
		if err == nil {
			t.Errorf("endpoint %q accepted", ep)
			continue
		}
		t.Logf("%q: %v", ep, err)
	}
}

// A collector outage: down at start, then up. Submit never blocks, the queue
// stays bounded, drops are counted, export resumes, and every span is
// accounted for.
func TestOTLPOutageThenRecovery(t *testing.T) {
	addr := reservePort(t) // nothing listens yet
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{Endpoint: "http://" + addr, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(exp, PipelineConfig{
		QueueSize: 200, BatchSize: 50, MaxBatchSize: 100, BatchTimeout: 20 * time.Millisecond,
		ExportTimeout: 300 * time.Millisecond, InitialBackoff: 50 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, MaxRetryTime: 800 * time.Millisecond,
	})

	submitted := 0
	submit := func(n int) {
		base := time.Now()
		for i := 0; i < n; i++ {
			s := testSpans(base)[3]
			s.SpanID = sid(fmt.Sprintf("%016x", submitted+1))
			// Submit never waits for the exporter: a full queue drops
			// (counted, checked below) instead of blocking.
			p.Submit(s)
			submitted++
		}
	}

	// 1.5s of outage with a steady trickle: more than the queue holds.
	// GYMTRACE_OUTAGE=60s runs the full-length outage of issue 10.
	outage := 1500 * time.Millisecond
	if v := os.Getenv("GYMTRACE_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("GYMTRACE_OUTAGE=%q: %v", v, err)
		}
		outage = d
	}
	for i := 0; i < int(outage/(100*time.Millisecond)); i++ {
		submit(50)
		// Bounded by the queue plus the batch being retried (MaxBatchSize).
		if st := p.Stats(); st.QueueLen > st.QueueCap+100 {
			t.Fatalf("queue grew past its bound: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	st := p.Stats()
	if st.Dropped == 0 {
		t.Fatalf("no drops counted during the outage: %+v", st)
	}
	if st.Exported != 0 {
		t.Fatalf("exported %d spans with no receiver", st.Exported)
	}
	t.Logf("during outage: %+v", st)

	// The collector comes back on the same address.
	rcv := &receiver{t: t, addr: addr}
	rcv.start()
	defer rcv.stop()
	recovered := time.Now()
	submit(100)
	waitFor(t, 30*time.Second, "export to resume", func() bool { return p.Stats().Exported >= 100 })
	t.Logf("export resumed %v after the receiver came back", time.Since(recovered).Round(time.Millisecond))

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	st = p.Stats()
	t.Logf("final: %+v, received %d", st, rcv.count())
	if got := st.Exported + st.Failed + st.Dropped; got != uint64(submitted) {
		t.Errorf("accounting: exported+failed+dropped = %d, submitted %d (%+v)", got, submitted, st)
	}
	if uint64(rcv.count()) != st.Exported {
		t.Errorf("receiver got %d spans, pipeline says %d exported", rcv.count(), st.Exported)
	}
}

// A collector that does not answer never slows Submit: with every export
// held (it answers after an hour, so an export ends only when the exporter
// gives up on it), 20000 Submits return, the queue stays bounded and the rest
// is dropped and counted, and Shutdown returns at its deadline reporting what
// it could not send. Nothing here is timed: the bounds below only turn a hang
// into a failure.
func TestOTLPSlowReceiverNeverBlocksSubmit(t *testing.T) {
	rcv := newReceiver(t)
	rcv.setDelay(time.Hour)
	ctx := context.Background()
	exp, err := NewOTLP(ctx, OTLPConfig{Endpoint: "http://" + rcv.addr})
	if err != nil {
		t.Fatal(err)
	}
	p := NewPipeline(exp, PipelineConfig{QueueSize: 1000, BatchSize: 100, BatchTimeout: 10 * time.Millisecond})
	s := testSpans(time.Now())[3]
	submitted := make(chan struct{})
	go func() {
		defer close(submitted)
		for i := 0; i < 20000; i++ {
			p.Submit(s)
		}
	}()
	select {
	case <-submitted:
	case <-time.After(2 * time.Minute):
		t.Fatalf("20000 Submits had not returned after 2 minutes with the collector holding every export: %+v", p.Stats())
	}
	st := p.Stats()
	t.Logf("20000 Submits with the collector holding every export: %+v", st)
	// Bounded by the queue plus one call's batch (MaxBatchSize, 4 x 100);
	// had Submit waited for room, nothing would have been dropped.
	if st.Dropped == 0 || st.QueueLen > st.QueueCap+400 {
		t.Errorf("want a bounded queue with drops: %+v", st)
	}
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(sctx) }()
	select {
	case err = <-shut:
	case <-time.After(2 * time.Minute):
		t.Fatal("Shutdown with a 500ms deadline had not returned after 2 minutes")
	}
	if err == nil {
		t.Error("shutdown reported no unsent spans with a collector that never answered and a 500ms deadline")
	}
	st = p.Stats()
	if got := st.Exported + st.Failed + st.Dropped; got != 20000 {
		t.Errorf("accounting after shutdown: %+v sums to %d, want 20000", st, got)
	}
}
