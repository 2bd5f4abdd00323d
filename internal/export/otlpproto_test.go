package export

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// sdkReadOnlySpans is the oracle: gymtrace spans as SDK read-only spans with
// their ids, parents and times unchanged (what the exporter handed the SDK
// before ProtoSpans).
func sdkReadOnlySpans(batch []spans.Span, res *Resources) []sdktrace.ReadOnlySpan {
	out := make([]sdktrace.ReadOnlySpan, len(batch))
	for i := range batch {
		s := &batch[i]
		stub := tracetest.SpanStub{
			Name: s.Name,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: s.TraceID, SpanID: s.SpanID, TraceFlags: trace.FlagsSampled,
			}),
			SpanKind:             s.Kind,
			StartTime:            s.Start,
			EndTime:              s.End,
			Attributes:           Sanitize(s.Attrs),
			Status:               sdktrace.Status{Code: s.Status},
			Resource:             res.For(s.Proc),
			InstrumentationScope: instrumentation.Scope{Name: ScopeName},
		}
		if s.Status == codes.Error {
			stub.Status.Description = s.StatusMsg
		}
		if s.Parent.IsValid() {
			stub.Parent = trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: s.TraceID, SpanID: s.Parent, TraceFlags: trace.FlagsSampled,
			})
		}
		for _, l := range s.Links {
			stub.Links = append(stub.Links, sdktrace.Link{SpanContext: l.SpanContext, Attributes: Sanitize(l.Attributes)})
		}
		out[i] = stub.Snapshot()
	}
	return out
}

// captureClient is an otlptrace.Client that keeps what the SDK exporter
// would send.
type captureClient struct{ got []*tracepb.ResourceSpans }

func (c *captureClient) Start(context.Context) error { return nil }
func (c *captureClient) Stop(context.Context) error  { return nil }
func (c *captureClient) UploadTraces(_ context.Context, rs []*tracepb.ResourceSpans) error {
	c.got = append(c.got, rs...)
	return nil
}

// The SDK groups by resource through a map, so its order is random; compare
// in the order of the resources' encoding.
func sortedByResource(t *testing.T, rs []*tracepb.ResourceSpans) []*tracepb.ResourceSpans {
	t.Helper()
	key := func(r *tracepb.ResourceSpans) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.Resource)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b *tracepb.ResourceSpans) int { return bytes.Compare(key(a), key(b)) })
	return out
}

func oracleBatch() []spans.Span {
	base := time.Unix(1_700_000_000, 123456789)
	batch := testSpans(base)
	linked := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid("0af7651916cd43dd8448eb211c80319c"), SpanID: sid("4444444444444444"),
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	batch = append(batch,
		spans.Span{
			Name: "gym.rollout", Kind: trace.SpanKindInternal, TraceID: tid("4bf92f3577b34da6a3ce929d0e0e4736"),
			SpanID: sid("5555555555555555"), Parent: sid("2222222222222222"),
			Start: base.Add(-time.Second), End: base.Add(2 * time.Second), Status: codes.Ok,
			Attrs: []attribute.KeyValue{
				attribute.Bool("gym.truncated", true), attribute.Float64("gym.reward", 0.75),
				attribute.StringSlice("gym.tags", []string{"a", "b"}), attribute.Int64Slice("gym.ids", []int64{1, 2}),
				attribute.BoolSlice("gym.flags", []bool{true}), attribute.Float64Slice("gym.f", []float64{1.5}),
				attribute.Int("gym.task_index", 3), attribute.String("url.full", "http://h/p?secret=1"),
			},
			Links: []trace.Link{
				{SpanContext: linked, Attributes: []attribute.KeyValue{attribute.String("gym.link", "retry"), attribute.String("cookie", "x")}},
				{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid("0af7651916cd43dd8448eb211c80319c"), SpanID: sid("6666666666666666")})},
			},
			Group: "rollout", Proc: agentProc,
		},
		spans.Span{ // a span with no process: the host-only resource
			Name: "GET /health", Kind: trace.SpanKindServer, TraceID: tid("0af7651916cd43dd8448eb211c80319c"),
			SpanID: sid("7777777777777777"), Start: time.Unix(0, 0), End: time.Unix(0, 0), Group: "server",
		},
	)
	return batch
}

// ProtoSpans makes the very messages the SDK's exporter makes from the same
// spans as read-only spans: ids, parents, times, kinds, statuses, flags,
// links, every attribute type, sanitizing, resources and scope.
func TestProtoSpansMatchesTheSDKTransform(t *testing.T) {
	res := NewResources("node-a")
	batch := oracleBatch()
	cc := &captureClient{}
	exp := otlptrace.NewUnstarted(cc)
	if err := exp.ExportSpans(context.Background(), sdkReadOnlySpans(batch, res)); err != nil {
		t.Fatal(err)
	}
	want := sortedByResource(t, cc.got)
	got := sortedByResource(t, ProtoSpans(batch, res))
	if len(got) != len(want) {
		t.Fatalf("%d ResourceSpans, the SDK makes %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("resource %d differs from the SDK's:\n got  %v\n want %v", i, got[i], want[i])
		}
	}
	// Order: resources as first seen, spans in batch order within each.
	direct := ProtoSpans(batch, res)
	if n := len(direct[0].ScopeSpans[0].Spans); n == 0 || direct[0].ScopeSpans[0].Spans[0].Name != batch[0].Name {
		t.Fatalf("first resource's first span = %v, want %q", direct[0].ScopeSpans[0].Spans, batch[0].Name)
	}
	if ProtoSpans(nil, res) != nil {
		t.Fatal("an empty batch must make no message")
	}
}

func BenchmarkOTLPEncode(b *testing.B) {
	res := NewResources("node-a")
	one := oracleBatch()
	var batch []spans.Span
	for len(batch) < 512 {
		batch = append(batch, one...)
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rs := ProtoSpans(batch, res)
			if _, err := proto.Marshal(&tracepb.TracesData{ResourceSpans: rs}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		cc := &captureClient{}
		exp := otlptrace.NewUnstarted(cc)
		for b.Loop() {
			cc.got = cc.got[:0]
			if err := exp.ExportSpans(context.Background(), sdkReadOnlySpans(batch, res)); err != nil {
				b.Fatal(err)
			}
			if _, err := proto.Marshal(&tracepb.TracesData{ResourceSpans: cc.got}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
