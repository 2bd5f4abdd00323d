package export

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// fakeExporter records batches; failN makes the first N calls fail.
type fakeExporter struct {
	mu        sync.Mutex
	batches   [][]spans.Span
	failN     int
	panicOnce bool
	shutdown  bool
}

func (f *fakeExporter) Export(ctx context.Context, b []spans.Span) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panicOnce {
		f.panicOnce = false
		panic("exporter bug")
	}
	if f.failN > 0 {
		f.failN--
		return errors.New("collector unavailable")
	}
	f.batches = append(f.batches, append([]spans.Span(nil), b...))
	return nil
}

func (f *fakeExporter) Shutdown(context.Context) error {
	f.mu.Lock()
	f.shutdown = true
	f.mu.Unlock()
	return nil
}

func (f *fakeExporter) sizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for _, b := range f.batches {
		out = append(out, len(b))
	}
	return out
}

func named(n int) []spans.Span {
	out := make([]spans.Span, n)
	for i := range out {
		out[i].Name = "s"
	}
	return out
}

func TestPipelineBatchesBySizeAndTime(t *testing.T) {
	// By size, with a timer that never runs in the test: whatever the
	// machine's pace, only whole batches go.
	f := &fakeExporter{}
	p := NewPipeline(f, PipelineConfig{BatchSize: 10, MaxBatchSize: 20, BatchTimeout: time.Hour})
	defer p.Shutdown(context.Background())
	p.Submit(named(9)...)
	p.Submit(named(36)...)
	// 45 wait: whole batches go at once, two per call (MaxBatchSize), and
	// the remaining 5 wait for the timer; the first 9 never went alone.
	waitFor(t, 30*time.Second, "the full batches", func() bool { return p.Stats().Exported == 40 })
	if s := f.sizes(); len(s) != 2 || s[0] != 20 || s[1] != 20 {
		t.Fatalf("batches %v, want [20 20] before the timer", s)
	}
	if st := p.Stats(); st.QueueLen != 5 || st.Dropped != 0 {
		t.Fatalf("stats %+v, want 5 queued", st)
	}

	// By time: a partial batch goes when the timer runs.
	g := &fakeExporter{}
	q := NewPipeline(g, PipelineConfig{BatchSize: 10, BatchTimeout: 20 * time.Millisecond})
	defer q.Shutdown(context.Background())
	q.Submit(named(5)...)
	waitFor(t, 30*time.Second, "the partial batch on the timer", func() bool { return len(g.sizes()) == 1 })
	if s := g.sizes(); s[0] != 5 {
		t.Fatalf("batches %v", s)
	}
	if st := q.Stats(); st.Exported != 5 || st.QueueLen != 0 || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPipelineFlushAndShutdownDrain(t *testing.T) {
	f := &fakeExporter{}
	p := NewPipeline(f, PipelineConfig{BatchSize: 100, BatchTimeout: time.Hour})
	p.Submit(named(3)...)
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Exported != 3 {
		t.Fatalf("after Flush: %+v", st)
	}
	p.Submit(named(7)...)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Exported != 10 {
		t.Fatalf("after Shutdown: %+v", st)
	}
	if !f.shutdown {
		t.Fatal("exporter not shut down")
	}
	if n := p.Submit(named(2)...); n != 0 || p.Stats().Dropped != 2 {
		t.Fatalf("Submit after Shutdown accepted %d, stats %+v", n, p.Stats())
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}

func TestPipelineRetriesWithBackoffThenSucceeds(t *testing.T) {
	f := &fakeExporter{failN: 3}
	p := NewPipeline(f, PipelineConfig{BatchSize: 5, BatchTimeout: 10 * time.Millisecond,
		InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	defer p.Shutdown(context.Background())
	p.Submit(named(5)...)
	waitFor(t, 30*time.Second, "the batch after 3 failures", func() bool { return p.Stats().Exported == 5 })
	if st := p.Stats(); st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPipelineGivesUpAfterMaxRetryTime(t *testing.T) {
	f := &fakeExporter{failN: 1 << 30}
	p := NewPipeline(f, PipelineConfig{BatchSize: 5, BatchTimeout: 10 * time.Millisecond,
		InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxRetryTime: 100 * time.Millisecond})
	p.Submit(named(5)...)
	waitFor(t, 30*time.Second, "the batch to be given up", func() bool { return p.Stats().Failed == 5 })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	p.Shutdown(ctx)
}

func TestPipelineQueueIsBoundedAndDropsAreCounted(t *testing.T) {
	block := make(chan struct{})
	exp := exporterFunc(func(ctx context.Context, b []spans.Span) error {
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	p := NewPipeline(exp, PipelineConfig{QueueSize: 50, BatchSize: 10, BatchTimeout: time.Millisecond})
	accepted := 0
	for i := 0; i < 100; i++ {
		accepted += p.Submit(named(1)...)
	}
	st := p.Stats()
	if st.Dropped == 0 || uint64(accepted)+st.Dropped != 100 {
		t.Fatalf("accepted %d, stats %+v", accepted, st)
	}
	if st.QueueLen > 60 {
		t.Fatalf("queue beyond its bound: %+v", st)
	}
	close(block)
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	st = p.Stats()
	if st.Exported+st.Failed+st.Dropped != 100 {
		t.Fatalf("spans unaccounted for: %+v", st)
	}
}

func TestPipelineSurvivesAPanickingExporter(t *testing.T) {
	f := &fakeExporter{panicOnce: true}
	p := NewPipeline(f, PipelineConfig{BatchSize: 2, BatchTimeout: 10 * time.Millisecond, InitialBackoff: 5 * time.Millisecond})
	defer p.Shutdown(context.Background())
	p.Submit(named(2)...)
	waitFor(t, 30*time.Second, "the retry after the panic", func() bool { return p.Stats().Exported == 2 })
}

type exporterFunc func(context.Context, []spans.Span) error

func (f exporterFunc) Export(ctx context.Context, b []spans.Span) error { return f(ctx, b) }
func (exporterFunc) Shutdown(context.Context) error                     { return nil }
