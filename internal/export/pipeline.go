package export

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// PipelineConfig tunes a Pipeline. Zero fields take the defaults shown.
type PipelineConfig struct {
	QueueSize int // spans held while the exporter is slow or down (8192)
	BatchSize int // spans per Export call (512)
	// MaxBatchSize is the most spans one Export call carries when more than
	// a batch waits (4 x BatchSize): a collector that is slow to answer
	// then gets fewer, larger requests instead of a queue that overflows.
	// At most QueueSize + MaxBatchSize spans are held (the queue and the
	// batch being sent or retried).
	MaxBatchSize   int
	BatchTimeout   time.Duration // longest a span waits for its batch to fill (1s)
	ExportTimeout  time.Duration // one Export attempt (10s)
	InitialBackoff time.Duration // first wait after a failed attempt (500ms)
	MaxBackoff     time.Duration // longest wait between attempts (5s)
	// MaxRetryTime is how long one batch is retried before it is given up and
	// counted as failed (30s). Meanwhile new spans wait in the queue, or are
	// dropped and counted when it is full.
	MaxRetryTime time.Duration
	Logger       *slog.Logger
}

func (c *PipelineConfig) setDefaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 8192
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 512
	}
	if c.BatchSize > c.QueueSize {
		c.BatchSize = c.QueueSize
	}
	if c.MaxBatchSize < c.BatchSize {
		c.MaxBatchSize = 4 * c.BatchSize
	}
	c.MaxBatchSize = min(c.MaxBatchSize, c.QueueSize)
	def(&c.BatchTimeout, time.Second)
	def(&c.ExportTimeout, 10*time.Second)
	def(&c.InitialBackoff, 500*time.Millisecond)
	def(&c.MaxBackoff, 5*time.Second)
	def(&c.MaxRetryTime, 30*time.Second)
	if c.MaxBackoff < c.InitialBackoff {
		c.MaxBackoff = c.InitialBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Stats are the pipeline's counters, cumulative since it started. The field
// set matches metrics.ExportStats, so one converts to the other directly.
type Stats struct {
	Exported uint64 // spans the exporter accepted
	Failed   uint64 // spans given up after retries, or unsent at shutdown
	Dropped  uint64 // spans refused because the queue was full or closed
	QueueLen int    // spans waiting now, including a batch being retried
	QueueCap int
}

// Pipeline batches spans in front of an Exporter. Submit never blocks and
// never waits on the network; a bounded queue absorbs slow or absent
// collectors, a single worker exports with retries and backoff, and every
// span lost on the way is counted.
type Pipeline struct {
	exp Exporter
	cfg PipelineConfig
	log *slog.Logger

	mu     sync.Mutex
	queue  []spans.Span // ring of cap QueueSize
	head   int
	n      int
	closed bool

	wake     chan struct{} // cap 1: the queue reached a batch, or a flush was asked for
	flushReq chan chan struct{}
	stop     chan struct{}
	done     chan struct{}

	inFlight atomic.Int64 // spans taken from the queue, not yet exported or given up
	exported atomic.Uint64
	failed   atomic.Uint64
	dropped  atomic.Uint64

	// base is the parent of every export attempt; it ends when the shutdown
	// context does, so a hung collector cannot hold up exit.
	base       context.Context
	cancelBase context.CancelFunc

	lastErrLog time.Time
}

// NewPipeline starts a pipeline in front of exp. Call Shutdown to flush and
// stop it.
func NewPipeline(exp Exporter, cfg PipelineConfig) *Pipeline {
	cfg.setDefaults()
	p := &Pipeline{
		exp:      exp,
		cfg:      cfg,
		log:      cfg.Logger.With("component", "export"),
		queue:    make([]spans.Span, cfg.QueueSize),
		wake:     make(chan struct{}, 1),
		flushReq: make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	p.base, p.cancelBase = context.WithCancel(context.Background())
	go p.run()
	return p
}

// Submit queues finished spans for export and returns at once. Spans that do
// not fit in the queue, or arrive after Shutdown began, are dropped and
// counted. It reports how many were accepted.
func (p *Pipeline) Submit(batch ...spans.Span) int {
	if len(batch) == 0 {
		return 0
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.dropped.Add(uint64(len(batch)))
		return 0
	}
	size := len(p.queue)
	accepted := min(len(batch), size-p.n)
	for i := range accepted {
		p.queue[(p.head+p.n+i)%size] = batch[i]
	}
	p.n += accepted
	full := p.n >= p.cfg.BatchSize
	p.mu.Unlock()

	if lost := len(batch) - accepted; lost > 0 {
		p.dropped.Add(uint64(lost))
	}
	if full {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return accepted
}

// Stats returns the counters now.
func (p *Pipeline) Stats() Stats {
	p.mu.Lock()
	n := p.n
	p.mu.Unlock()
	return Stats{
		Exported: p.exported.Load(),
		Failed:   p.failed.Load(),
		Dropped:  p.dropped.Load(),
		QueueLen: n + int(p.inFlight.Load()),
		QueueCap: len(p.queue),
	}
}

// Flush exports everything queued now and returns when that is done (or
// given up), or when ctx ends.
func (p *Pipeline) Flush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case p.flushReq <- ack:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flushing spans: %w", ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flushing spans: %w", ctx.Err())
	}
}

// Shutdown stops accepting spans, exports what is queued while ctx allows,
// then shuts the exporter down. Spans still unsent when ctx ends are counted
// as failed. Calling it twice is harmless.
func (p *Pipeline) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if !already {
		context.AfterFunc(ctx, p.cancelBase)
		close(p.stop)
	}
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		err = fmt.Errorf("flushing spans at shutdown: %w (the rest were counted as failed)", ctx.Err())
		// Attempts in flight were cancelled with ctx, so the worker counts
		// the rest as failed and ends promptly; wait for it (bounded, in
		// case an exporter ignores its context) so the counters are final
		// and the exporter is not shut down under its feet.
		select {
		case <-p.done:
		case <-time.After(time.Second):
		}
	}
	if already {
		return err
	}
	if e := p.exp.Shutdown(ctx); e != nil {
		err = errors.Join(err, fmt.Errorf("shutting down exporter: %w", e))
	}
	return err
}

func (p *Pipeline) run() {
	defer close(p.done)
	defer p.cancelBase()
	timer := time.NewTimer(p.cfg.BatchTimeout)
	defer timer.Stop()
	for {
		var ack chan struct{}
		partial := false
		select {
		case <-p.stop:
			p.drain()
			return
		case ack = <-p.flushReq:
			partial = true
		case <-p.wake:
		case <-timer.C:
			partial = true
		}
		// Send full batches while there are any; a partial one only on the
		// timer or a flush, so small bursts still go out in one call.
		for !p.stopping() {
			b := p.take(partial)
			if b == nil {
				break
			}
			p.exportWithRetry(b, p.stop)
		}
		if ack != nil {
			close(ack)
		}
		timer.Reset(p.cfg.BatchTimeout)
	}
}

// take removes the next batch from the queue: whole batches while at least
// one is there (several in one call, up to MaxBatchSize, when the exporter
// has fallen behind), or with partial set, whatever is there.
func (p *Pipeline) take(partial bool) []spans.Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 || (!partial && p.n < p.cfg.BatchSize) {
		return nil
	}
	k := p.n
	if !partial {
		k -= k % p.cfg.BatchSize
	}
	k = min(k, p.cfg.MaxBatchSize)
	b := make([]spans.Span, k)
	size := len(p.queue)
	for i := range k {
		j := (p.head + i) % size
		b[i] = p.queue[j]
		p.queue[j] = spans.Span{} // release attrs and Proc for the GC
	}
	p.head = (p.head + k) % size
	p.n -= k
	p.inFlight.Store(int64(k))
	return b
}

// exportWithRetry sends b, retrying with exponential backoff until it is
// accepted, MaxRetryTime has passed, or abort is closed.
func (p *Pipeline) exportWithRetry(b []spans.Span, abort <-chan struct{}) bool {
	defer p.inFlight.Store(0)
	start := time.Now()
	wait := p.cfg.InitialBackoff
	for attempt := 1; ; attempt++ {
		if p.stopping() {
			return p.exportFinal(b)
		}
		err := p.exportOnce(p.base, b)
		if err == nil {
			p.exported.Add(uint64(len(b)))
			return true
		}
		if time.Since(start)+wait > p.cfg.MaxRetryTime {
			p.failed.Add(uint64(len(b)))
			p.log.Warn("giving up on a batch of spans; is the collector reachable?",
				"spans", len(b), "attempts", attempt, "error", err)
			return false
		}
		if p.stopping() {
			return p.exportFinal(b)
		}
		p.logRetry(err, attempt)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-abort:
			t.Stop()
			// Shutdown: one more try, bounded by the shutdown deadline.
			return p.exportFinal(b)
		}
		wait = min(wait*2, p.cfg.MaxBackoff)
	}
}

// logRetry logs the first failure of an outage and then at most every 10s, so
// a down collector does not flood the log.
func (p *Pipeline) logRetry(err error, attempt int) {
	if attempt == 1 || time.Since(p.lastErrLog) > 10*time.Second {
		p.lastErrLog = time.Now()
		p.log.Warn("exporting spans failed, retrying; spans queue meanwhile and are dropped when the queue is full",
			"error", err, "queued", p.Stats().QueueLen, "queue_cap", len(p.queue))
	}
}

func (p *Pipeline) stopping() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

func (p *Pipeline) exportOnce(ctx context.Context, b []spans.Span) (err error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ExportTimeout)
	defer cancel()
	defer func() {
		// An exporter bug must cost spans, not the tracer.
		if r := recover(); r != nil {
			err = fmt.Errorf("exporter panicked: %v", r)
		}
	}()
	return p.exp.Export(ctx, b)
}

// exportFinal is the last attempt for b during shutdown, bounded by the
// shutdown context.
func (p *Pipeline) exportFinal(b []spans.Span) bool {
	ctx := p.base
	if ctx.Err() == nil {
		if err := p.exportOnce(ctx, b); err == nil {
			p.exported.Add(uint64(len(b)))
			return true
		}
	}
	p.failed.Add(uint64(len(b)))
	return false
}

// drain exports what is left after Shutdown, one attempt per batch, while the
// shutdown context allows; the rest is counted as failed.
func (p *Pipeline) drain() {
	for {
		b := p.take(true)
		if b == nil {
			return
		}
		p.exportFinal(b)
		p.inFlight.Store(0)
	}
}
