//go:build linux

package spans

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// With Unsampled, the spans of traces the sampler drops come out too,
// marked, with their measures, and are not counted as spans built.
func TestUnsampledSpansForMetrics(t *testing.T) {
	for _, keep := range []bool{false, true} {
		s := newSim(t, "per_rollout")
		b, err := NewBuilder(Options{
			Mask:      s.mask,
			Lookup:    func(pid int) *discover.Process { return s.procs[uint32(pid)] },
			IDs:       &SequentialIDs{},
			Clock:     http.NewClockWithOffset(time.Duration(1_700_000_000) * time.Second),
			Sampler:   sdktrace.NeverSample(),
			Unsampled: keep,
		})
		if err != nil {
			t.Fatal(err)
		}
		s.b, s.p = b, NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
		g := newGymStack(s, false)
		g.rollout(0, 7, 0)
		want := len(rolloutTrees["per_rollout"])
		st := b.Stats()
		if st.Unsampled != uint64(want) {
			t.Errorf("keep=%v: %d unsampled, want %d", keep, st.Unsampled, want)
		}
		for _, n := range st.Spans {
			if n != 0 {
				t.Errorf("keep=%v: unsampled spans counted as built: %v", keep, st.Spans)
				break
			}
		}
		if !keep {
			if len(s.spans) != 0 {
				t.Errorf("%d spans returned without Unsampled", len(s.spans))
			}
			continue
		}
		if len(s.spans) != want {
			t.Fatalf("%d spans returned, want %d", len(s.spans), want)
		}
		verify := 0
		for _, sp := range s.spans {
			if sp.Sampled {
				t.Errorf("%s marked sampled", sp.Name)
			}
			if sp.Name == "gym.verify" {
				verify++
			}
		}
		if verify != 1 {
			t.Errorf("%d gym.verify spans, want 1", verify)
		}
	}
}

// ActiveServer lists the inbound requests in flight that have a SERVER span.
func TestActiveServer(t *testing.T) {
	s := newSim(t, "per_rollout")
	c := s.dial(pidAgent, pidResources, "10.0.0.3:8003")
	k := c.request(loader.MethodPOST, "/verify")
	n := 0
	s.b.ActiveServer(func(a ActiveRequest) {
		n++
		if a.PID != pidResources || a.Method != "POST" || a.Scheme != "http" || a.Port != 8003 {
			t.Errorf("active %+v", a)
		}
	})
	if n != 1 {
		t.Errorf("%d active, want 1", n)
	}
	k.respond(200)
	n = 0
	s.b.ActiveServer(func(ActiveRequest) { n++ })
	if n != 0 {
		t.Errorf("%d active after the response", n)
	}
}
