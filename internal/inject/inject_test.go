//go:build linux

package inject

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

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
