//go:build linux

package spans

import (
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// BenchmarkPipeline measures ring-buffer bytes -> Decode -> Assembler ->
// Builder -> spans for Gym rollouts, and reports spans/s on one core.
func BenchmarkPipeline(b *testing.B) {
	for _, spec := range []string{"default", "per_rollout"} {
		b.Run(spec, func(b *testing.B) {
			rec := newSim(b, spec)
			rec.record = true
			g := newGymStack(rec, false)
			for i := 0; i < 4; i++ {
				g.rollout(i, 1, int32(i))
			}
			records := rec.rec

			mask, _ := groups.Resolve(spec)
			procs := rec.procs
			ids, err := NewRandomIDs()
			if err != nil {
				b.Fatal(err)
			}
			bl, err := NewBuilder(Options{
				Mask:   mask,
				Lookup: func(pid int) *discover.Process { return procs[uint32(pid)] },
				IDs:    ids,
				Clock:  http.NewClockWithOffset(time.Hour),
			})
			if err != nil {
				b.Fatal(err)
			}
			p := NewPipeline(http.NewAssembler(http.AssemblerOptions{}), bl)
			spans, exchanges := 0, 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for _, r := range records {
					out, err := p.Process(r)
					if err != nil {
						b.Fatal(err)
					}
					spans += len(out)
				}
			}
			b.StopTimer()
			for _, r := range records {
				ev, _ := http.Decode(r)
				if ev.Kind == loader.EvResponse {
					exchanges++
				}
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(spans)/sec, "spans/s")
			b.ReportMetric(float64(exchanges*b.N)/sec, "exchanges/s")
			if st := p.Stats(); st.Builder.OpenServer+st.Builder.OpenClient != 0 {
				b.Fatalf("state leaked across rollouts: %+v", st.Builder)
			}
		})
	}
}
