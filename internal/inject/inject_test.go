//go:build linux

package inject

import (
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The kernel's sampled bit for the traces it starts must be the userspace
// sampler's decision for the same trace id, or a trace would be exported on
// one node and dropped on the next.
func TestRootBoundAgreesWithTraceIDRatioBased(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, ratio := range []float64{0, 0.001, 0.1, 0.25, 0.5, 0.9, 0.999, 1} {
		s := sdktrace.TraceIDRatioBased(ratio)
		bound := RootBound(ratio)
		for i := 0; i < 20000; i++ {
			var tid trace.TraceID
			binary.BigEndian.PutUint64(tid[:8], r.Uint64())
			binary.BigEndian.PutUint64(tid[8:], r.Uint64())
			// bpf/inject.h: (big-endian trace_id[8:16] >> 1) < root_bound.
			kernel := binary.BigEndian.Uint64(tid[8:])>>1 < bound
			user := s.ShouldSample(sdktrace.SamplingParameters{TraceID: tid}).Decision == sdktrace.RecordAndSample
			if kernel != user {
				t.Fatalf("ratio %v, trace %v: kernel sampled=%v, OpenTelemetry sampled=%v", ratio, tid, kernel, user)
			}
		}
	}
}

func TestNilInjectorIsANoOp(t *testing.T) {
	var in *Injector
	in.Publish(1, 2, trace.TraceID{1}, trace.SpanID{1}, true)
	in.Unpublish(1, 2)
	in.PublishJob(1, trace.TraceID{1}, trace.SpanID{1}, true)
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := in.Stats(); err != nil || len(st) != statMax {
		t.Fatalf("Stats() = %v, %v", st, err)
	}
}

// testInjector is an Injector over a trace-context map of the kernel's shape,
// with no programs: enough for Publish, Unpublish and Flush.
func testInjector(t *testing.T) (*Injector, *ebpf.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a BPF map (run the tests as root, as CI does)")
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 16, ValueSize: 32, MaxEntries: 1024})
	if err != nil {
		t.Skipf("cannot create a BPF LRU hash map here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return &Injector{p: Programs{TraceCtxs: m}, log: slog.Default()}, m
}

// Publish defers a request's context to Flush; an exchange that ends before
// it never reaches the kernel's map. A job's context goes at once.
func TestPublishIsDeferredAndCancelled(t *testing.T) {
	in, m := testInjector(t)
	var v traceCtx
	has := func(k traceKey) bool { return m.Lookup(k, &v) == nil }

	in.Publish(5, 5, trace.TraceID{5}, trace.SpanID{5}, true)
	in.Publish(6, 6, trace.TraceID{6}, trace.SpanID{6}, false)
	in.PublishJob(9, trace.TraceID{9}, trace.SpanID{9}, true)
	if has(traceKey{5, 5}) || has(traceKey{6, 6}) {
		t.Fatal("a request's context reached the map before Flush")
	}
	if !has(traceKey{0, 9}) {
		t.Fatal("a job's context must reach the map at once")
	}
	in.Unpublish(6, 6) // ended before the flush: never written
	in.Flush()
	if !has(traceKey{5, 5}) || v.TraceID[0] != 5 || v.Flags != 1 {
		t.Fatalf("after Flush, (5, 5) = %+v, want trace 5 sampled", v)
	}
	if has(traceKey{6, 6}) {
		t.Fatal("an exchange unpublished before Flush was written to the map")
	}
	in.Publish(5, 5, trace.TraceID{7}, trace.SpanID{7}, false) // retraced
	in.Flush()
	if !has(traceKey{5, 5}) || v.TraceID[0] != 7 || v.Flags != 0 {
		t.Fatalf("a republished context: (5, 5) = %+v, want trace 7 not sampled", v)
	}
	in.Unpublish(5, 5)
	in.Flush()
	if has(traceKey{5, 5}) {
		t.Fatal("a flushed context was not deleted by the next Flush after Unpublish")
	}
	// Past maxPending waiting puts, Publish flushes by itself.
	for i := uint64(100); i < 100+maxPending; i++ {
		in.Publish(i, i, trace.TraceID{1}, trace.SpanID{1}, true)
	}
	if !has(traceKey{100, 100}) {
		t.Fatalf("%d waiting puts were not flushed", maxPending)
	}
}

// Unpublish defers deletes to Flush, which batches them past keys the kernel
// already dropped, and a job key published again is not deleted by a delete
// still pending for its previous owner.
func TestUnpublishIsDeferredAndBatched(t *testing.T) {
	in, m := testInjector(t)
	for i := uint64(1); i <= 300; i++ {
		in.Publish(i, i, trace.TraceID{1}, trace.SpanID{1}, true)
	}
	in.Unpublish(1000, 1) // never published: a batch must step over it
	for i := uint64(1); i < 300; i++ {
		in.Unpublish(i, i)
	}
	in.PublishJob(77, trace.TraceID{2}, trace.SpanID{2}, true)
	in.UnpublishJob(77)
	in.PublishJob(77, trace.TraceID{3}, trace.SpanID{3}, true) // the pid came back
	in.Flush()
	var v traceCtx
	var keys []traceKey
	it := m.Iterate()
	var k traceKey
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if len(keys) != 2 {
		t.Fatalf("after Flush the map holds %v, want the key (300, 300) and the job (0, 77)", keys)
	}
	if err := m.Lookup(traceKey{0, 77}, &v); err != nil || v.TraceID[0] != 3 {
		t.Fatalf("the republished job key: %v %v", v, err)
	}
	if err := m.Lookup(traceKey{300, 300}, &v); err != nil {
		t.Fatalf("the key still in use was deleted: %v", err)
	}
}
