// Package gymmetrics makes Gym's metrics from the spans gymtrace assembles:
// gym.rollout.duration_ms, gym.verify.duration_ms, gym.verify.success_rate
// and gym.servers.active as nemo_gym/telemetry/metrics.py records them, the
// HTTP server metrics of the FastAPI instrumentation Gym runs, and two Gym
// does not have: an HTTP client duration and gym.verify.reward.
//
// Metrics come from spans, so the span groups gate them as they gate the
// spans, in the kernel: rollout → the rollout histogram, verify → the verify
// metrics, server → the HTTP server metrics, http_client → the client
// duration. A group that is off makes no spans and so no series.
//
// Each traced process has its own MeterProvider whose resource is the one its
// spans carry (service.name=nemo-gym/<server>, ...): as in Gym, the gym.*
// instruments carry no attributes and the resource tells servers apart. The
// OTel Go SDK aggregates; a periodic reader per process exports over OTLP
// (one shared exporter), and a Prometheus registry per process is gathered
// beside gymtrace's own metrics.
package gymmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/spans"
)

// DefaultMaxSeries bounds the distinct attribute sets one instrument keeps
// per process. Routes are templates, so a Gym server has a few dozen; past
// the bound measurements go to one otel.metric.overflow=true series and
// Stats.SeriesCapped counts them.
const DefaultMaxSeries = 200

// maxProcs bounds the processes with metrics at once; a host churning
// through short-lived traced processes must not grow without end.
const maxProcs = 512

// Active is one inbound request in flight that has a SERVER span.
type Active struct {
	PID            uint32
	Method, Scheme string
	Addr           string // the server's (local) address and port
	Port           int
	Host           string // the Host header as sent
}

// Config configures a Recorder.
type Config struct {
	// Exporter sends OTLP metrics (nil: none). One exporter serves every
	// process's periodic reader; OTEL_METRIC_EXPORT_INTERVAL and
	// OTEL_METRIC_EXPORT_TIMEOUT set the readers' period and timeout.
	Exporter sdkmetric.Exporter
	// Prometheus makes Gather serve the metrics.
	Prometheus bool
	Semconv    Semconv // 0: SemconvOld
	// Resources gives each process its resource, the one its spans carry.
	Resources *export.Resources
	MaxSeries int // 0: DefaultMaxSeries
	// Reward is whether the kernel reads rewards (a gym.verify span without
	// one then counts as Stats.RewardMissing).
	Reward bool
	// Servers returns how many Gym servers the orchestrator pid started that
	// are running now (gym.servers.active).
	Servers func(pid int) int
	// Active calls yield for each inbound request in flight with a SERVER
	// span (http.server.active_requests), at collection time.
	Active func(yield func(Active))
	// Pressure gives every process the process and host pressure gauges
	// (gym.process.cpu.percent, ...), fed by SetPressure.
	Pressure bool
	// Linger is how long an exited process's metrics stay, so the last
	// values (gym.servers.active at 0) are exported and scraped. 0: 30 s.
	Linger time.Duration
	Log    *slog.Logger
}

// Stats are the Recorder's counters, for gymtrace's own metrics.
type Stats struct {
	Processes     int    // processes with metrics now
	SeriesCapped  uint64 // measurements put in the overflow series: the series cap was reached
	RewardMissing uint64 // gym.verify spans without a reward: the kernel did not find it in the response
	ProcsCapped   uint64 // spans not measured: too many processes with metrics at once
}

// Recorder turns finished spans into Gym's metrics. Safe for concurrent use.
type Recorder struct {
	cfg Config
	exp sdkmetric.Exporter // cfg.Exporter behind a Shutdown only Close calls

	mu    sync.Mutex
	procs map[procKey]*proc
	gone  map[int]time.Time // pids that exited, until Linger after: their late spans make no live provider
	sum   summary
	// retired: providers replaced when their process's identity changed,
	// closed (a last export) at the next Tick or by Close. closing counts
	// the closes Tick started; Close waits for them, so nothing a provider
	// exports comes after Close's own last exports.
	retired []*proc
	closing sync.WaitGroup
	closed  bool // Close ran: spans and processes are no longer measured

	reward                             atomic.Bool // the kernel reads rewards now (SetReward)
	capped, rewardMissing, procsCapped atomic.Uint64

	press atomic.Pointer[pressureNow] // the last pressure sample (SetPressure)

	amu       sync.Mutex // the active-requests snapshot, shared by every process's collection
	active    []Active
	activeAt  time.Time
	activeAge time.Duration // how old a snapshot may be
}

type procKey struct {
	pid   int
	start uint64
}

// New makes a Recorder.
func New(cfg Config) *Recorder {
	if cfg.Semconv == 0 {
		cfg.Semconv = SemconvOld
	}
	if cfg.MaxSeries <= 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 30 * time.Second
	}
	if cfg.Resources == nil {
		cfg.Resources = export.NewResources("")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	r := &Recorder{cfg: cfg, procs: map[procKey]*proc{}, gone: map[int]time.Time{}}
	r.reward.Store(cfg.Reward)
	r.activeAge = 100 * time.Millisecond
	if cfg.Exporter != nil {
		r.exp = sharedExporter{cfg.Exporter}
	}
	return r
}

// Observe measures finished spans, sampled or not.
func (r *Recorder) Observe(batch []spans.Span) {
	if len(batch) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	for i := range batch {
		s := &batch[i]
		kind := measureKind(s)
		if kind == kindNone || truncated(s) {
			continue
		}
		pr := r.procLocked(s.Proc)
		if pr == nil {
			r.procsCapped.Add(1)
			continue
		}
		r.measure(pr, s, kind)
	}
}

// Seen tells the Recorder of a discovered process: an orchestrator gets its
// gym.servers.active gauge now, before (and without) any traffic of its own.
func (r *Recorder) Seen(p *discover.Process) {
	if p == nil || p.Role != discover.RoleOrchestrator {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.procLocked(p)
	}
}

// SetReward says whether the kernel reads rewards now (a reload can change
// it): only then is a gym.verify span without one counted as missing.
func (r *Recorder) SetReward(on bool) { r.reward.Store(on) }

// Gone tells the Recorder that pid exited: its gauges read 0 from now, and
// its metrics go after Linger (Tick). Spans of it that come later (released
// by the builder when it forgets the process) are measured into a provider
// that goes at the same time.
func (r *Recorder) Gone(pid int) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone[pid] = now
	for k, pr := range r.procs {
		if k.pid == pid {
			pr.gone.CompareAndSwap(0, now.UnixNano())
		}
	}
}

// Tick drops the metrics of processes that exited more than Linger ago, and
// the providers retired since the last Tick, after a last export, without
// waiting for it. Call it every few seconds.
func (r *Recorder) Tick(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	done := r.retired
	r.retired = nil
	for k, pr := range r.procs {
		if g := pr.goneAt(); !g.IsZero() && now.Sub(g) >= r.cfg.Linger {
			delete(r.procs, k)
			done = append(done, pr)
		}
	}
	for pid, at := range r.gone {
		if now.Sub(at) >= r.cfg.Linger {
			delete(r.gone, pid)
		}
	}
	for _, pr := range done {
		r.closing.Add(1)
		go func() {
			defer r.closing.Done()
			pr.close(context.Background(), r.cfg.Log)
		}()
	}
}

// activeNow is the inbound requests in flight, read from the builder at
// most every 100 ms: every process's provider collects at about the same
// moment. The slice is never written after it is returned.
func (r *Recorder) activeNow() []Active {
	r.amu.Lock()
	defer r.amu.Unlock()
	if r.cfg.Active == nil {
		return nil
	}
	if time.Since(r.activeAt) >= r.activeAge {
		var now []Active
		r.cfg.Active(func(a Active) { now = append(now, a) })
		r.active, r.activeAt = now, time.Now()
	}
	return r.active
}

// Gather serves the Prometheus registries of every process with metrics.
func (r *Recorder) Gather() ([]*dto.MetricFamily, error) {
	r.mu.Lock()
	gs := make(prometheus.Gatherers, 0, len(r.procs))
	for _, pr := range r.procs {
		if pr.reg != nil {
			gs = append(gs, pr.reg)
		}
	}
	r.mu.Unlock()
	return gs.Gather()
}

// ForceFlush exports what every process has now (tests, shutdown).
func (r *Recorder) ForceFlush(ctx context.Context) error {
	var errs []error
	for _, pr := range r.snapshotProcs() {
		errs = append(errs, pr.mp.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

// Close exports the last values and stops every reader and the exporter,
// while ctx allows. What each process exports last is its current
// provider's final values: the closes Tick started finish first, then the
// providers replaced since close, then the current ones. Spans observed
// after are not measured.
func (r *Recorder) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	retired := r.retired
	r.retired = nil
	prs := slices.Collect(maps.Values(r.procs))
	clear(r.procs)
	r.mu.Unlock()
	var errs []error
	closing := make(chan struct{})
	go func() { r.closing.Wait(); close(closing) }()
	select {
	case <-closing:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for exited processes' last metrics: %w", ctx.Err()))
	}
	for _, pr := range append(retired, prs...) {
		errs = append(errs, pr.mp.Shutdown(ctx))
	}
	if r.cfg.Exporter != nil {
		errs = append(errs, r.cfg.Exporter.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// Stats returns the Recorder's counters.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	n := len(r.procs)
	r.mu.Unlock()
	return Stats{Processes: n, SeriesCapped: r.capped.Load(), RewardMissing: r.rewardMissing.Load(),
		ProcsCapped: r.procsCapped.Load()}
}

func (r *Recorder) snapshotProcs() []*proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Values(r.procs))
}

// procLocked returns p's metrics, made on first use. A process whose
// identity changed (its role or server name learnt later) gets a new
// provider with the new resource; the old one is retired (its last export at
// the next Tick, or at Close).
func (r *Recorder) procLocked(p *discover.Process) *proc {
	var id discover.Process
	if p != nil {
		id = *p
	}
	k := procKey{pid: id.PID, start: id.StartTime}
	if pr := r.procs[k]; pr != nil {
		if pr.p == id {
			return pr
		}
		delete(r.procs, k)
		r.retired = append(r.retired, pr) // its last export: next Tick, or Close
	}
	if len(r.procs) >= maxProcs {
		return nil
	}
	pr := newProc(r, id)
	if at, ok := r.gone[id.PID]; ok {
		pr.gone.Store(at.UnixNano())
	}
	r.procs[k] = pr
	return pr
}

// sharedExporter lets several readers share one exporter: a reader's
// Shutdown must not close it for the others (Close does, last).
type sharedExporter struct{ sdkmetric.Exporter }

func (sharedExporter) Shutdown(context.Context) error { return nil }

// overflow is the attribute set measurements take past the series cap, the
// one the OTel SDK's own cardinality limit uses.
var overflow = attribute.NewSet(attribute.Bool("otel.metric.overflow", true))

// attrSet returns the set to record kv under for instrument inst of pr,
// or the overflow set past the cap.
func (r *Recorder) attrSet(pr *proc, inst string, kv []attribute.KeyValue) attribute.Set {
	set := attribute.NewSet(kv...)
	seen := pr.series[inst]
	if seen == nil {
		seen = map[attribute.Distinct]struct{}{}
		pr.series[inst] = seen
	}
	if _, ok := seen[set.Equivalent()]; !ok {
		if len(seen) >= r.cfg.MaxSeries {
			r.capped.Add(1)
			return overflow
		}
		seen[set.Equivalent()] = struct{}{}
	}
	return set
}

func truncated(s *spans.Span) bool {
	return slices.ContainsFunc(s.Attrs, func(kv attribute.KeyValue) bool {
		return kv.Key == export.AttrTruncated && kv.Value.AsBool()
	})
}
