//go:build linux

// Package agent is one running gymtrace: it owns the lifecycle (start →
// attach → run → reload → detach), the targets and their probes. Discovery
// feeds targets to the loader, the ring-buffer reader feeds the span
// pipeline, the pipeline feeds the exporter; metrics sit beside them.
// cmd/gymtrace parses flags and calls Run.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/gymmetrics"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/metrics"
	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/internal/privs"
	"github.com/gymtrace/gymtrace/internal/spans"
	gttls "github.com/gymtrace/gymtrace/internal/tls"
)

// Options are what Run needs besides the configuration.
type Options struct {
	Log *slog.Logger
	// Term is where the tree exporter writes (os.Stdout when nil); on a
	// terminal a live status line runs under the trees.
	Term io.Writer
	// Reloads, when set, blocks until its context ends and calls apply with
	// each reloaded configuration (SIGHUP in cmd/gymtrace).
	Reloads func(ctx context.Context, apply func(*config.Config) error)
	// Attached, when set, is called once every target found at start is
	// traced (the demo starts its rollouts then).
	Attached func()
}

// UsageError marks a Run error caused by what the user asked for (a --pid of
// a process that does not exist), not by the machine.
type UsageError struct{ error }

func (e UsageError) Unwrap() error { return e.error }

// agent is the running state. Its methods are split by job: targets.go (the
// target set), python.go, tls.go, inject.go (per-target probes), gate.go
// (the kernel's gate and route table), exporter.go, sources.go (metrics).
type agent struct {
	log      *slog.Logger
	cfg      *config.Config
	kern     *loader.Tracer
	tls      *gttls.Attacher  // HTTPS: OpenSSL probes per target
	inj      *inject.Injector // traceparent into outbound requests; nil when off
	injState injectState      // whether injection is on, and why not (the gymtrace_inject_enabled metric)
	// injWanted: http_client is enabled, so targets' outbound sockets belong
	// in the injection sockhash (the kernel checks the mask itself).
	injWanted atomic.Bool
	spans     *spans.Pipeline
	clock     *http.Clock // the spans' clock (startPipeline): the expiry tick reads it too
	out       *export.Pipeline
	gym       *gymmetrics.Recorder // Gym's metrics; nil when off (gymmetrics.go)

	py       *pyTargets
	detached *closer // closes exited targets' probes in the background (detach.go)

	records atomic.Uint64 // ring-buffer records read

	mu    sync.RWMutex
	procs map[int]*discover.Process

	// Set while starting, used while running.
	pids      []int         // explicit --pid targets
	roles     map[int]uint8 // ... and the roles given with them
	metricsLn net.Listener  // opened before privileges are dropped
	status    *metrics.StatusLine
	undo      []func() // run in reverse by detach
}

// Run traces until ctx ends: it attaches, runs, applies reloads, then
// flushes and detaches.
func Run(ctx context.Context, cfg *config.Config, opt Options) error {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Term == nil {
		opt.Term = os.Stdout
	}
	if err := preflight.Required(ctx); err != nil {
		return err
	}
	t := &agent{log: opt.Log, cfg: cfg, procs: map[int]*discover.Process{}, roles: map[int]uint8{}}
	defer t.detach()
	if err := t.checkPIDs(); err != nil {
		return err
	}
	if err := t.attach(); err != nil {
		return err
	}
	if err := t.startPipeline(ctx, opt.Term); err != nil {
		return err
	}
	return t.run(ctx, opt)
}

// checkPIDs requires the explicit --pid targets to exist, before anything
// is attached.
func (t *agent) checkPIDs() error {
	for _, pr := range t.cfg.PIDs {
		if _, err := discover.Inspect(pr.PID); err != nil {
			return UsageError{fmt.Errorf("--pid %d: %w", pr.PID, err)}
		}
		t.pids = append(t.pids, pr.PID)
		t.roles[pr.PID] = pr.Role
	}
	return nil
}

// attach loads the kernel side and everything that needs privileges, then
// drops the privileges the run does not need.
func (t *agent) attach() error {
	cfg, log := t.cfg, t.log
	kern, err := loader.Load(loader.Options{RingbufBytes: cfg.RingbufBytes, Log: log})
	if err != nil {
		return err
	}
	t.kern = kern
	t.undo = append(t.undo, func() { kern.Close() })
	t.py = newPyTargets(t, cfg.Mask)
	t.undo = append(t.undo, t.py.close)
	if err := kern.SetRoutes(routeTable()); err != nil {
		return err
	}
	if err := t.applyMask(cfg); err != nil {
		return err
	}
	if t.tls, err = newTLSAttacher(kern, cfg.Mask, log); err != nil {
		return err
	}
	t.undo = append(t.undo, func() { t.tls.Close() })
	t.inj = startInjector(kern, cfg, log, &t.injState)
	t.injWanted.Store(cfg.Mask.Has(groups.HTTPClient))
	t.undo = append(t.undo, func() {
		if err := t.inj.Close(); err != nil {
			log.Debug("detaching traceparent injection", "err", err)
		}
	})
	// Exited targets' probes are closed by this, before the attachers and
	// the kernel objects are (undo runs last first).
	t.detached = newCloser(log)
	t.undo = append(t.undo, t.detached.stop)
	// The metrics port is opened now (a port below 1024 needs
	// CAP_NET_BIND_SERVICE) and served once the pipeline exists.
	if cfg.MetricsAddr != "" {
		if t.metricsLn, err = metrics.Listen(cfg.MetricsAddr); err != nil {
			return err
		}
		ln := t.metricsLn
		t.undo = append(t.undo, func() { ln.Close() })
	}
	// Everything that needs more than the run's own capabilities is
	// attached: drop the rest now, before the exporter, metrics and
	// discovery start goroutines (libcap's psx applies the change to every
	// thread with signals; with few threads there are few to race with).
	privs.DropAfterAttach(log, privs.Needs{Discovery: true, Uprobes: tlsWanted(cfg.Mask) || needsPy(cfg.Mask)})
	return nil
}

// startPipeline builds the userspace path: span builder, exporter, metrics.
func (t *agent) startPipeline(ctx context.Context, term io.Writer) error {
	cfg, log := t.cfg, t.log
	clock, err := http.NewClock()
	if err != nil {
		return fmt.Errorf("reading the clocks: %w", err)
	}
	t.clock = clock
	// Every span's wall-clock times share this error (durations do not).
	log.Info("span wall-clock times from the kernel's monotonic clock", "offset_within", clock.Uncertainty())
	b, err := spans.NewBuilder(spans.Options{
		Clock:     clock,
		Mask:      cfg.Mask,
		Lookup:    t.lookup,
		Sampler:   sampler(cfg.SampleRatio),
		Unsampled: cfg.GymMetrics, // metrics count every request
		Logger:    log.With("component", "spans"),
		Inject:    builderInjector(t.inj),
	})
	if err != nil {
		return fmt.Errorf("starting the span builder: %w", err)
	}
	t.spans = spans.NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
	// On a terminal, a live status line under the trace trees.
	if f, ok := term.(*os.File); ok && metrics.IsTerminal(f) {
		t.status = metrics.NewStatusLine(f, t.statusSnapshot)
		term = t.status
	}
	exp, err := newExporter(ctx, cfg, term, log)
	if err != nil {
		return err
	}
	pcfg := export.PipelineConfig{Logger: log.With("component", "export")}
	if cfg.Exporter == config.ExporterTree {
		pcfg.BatchTimeout = 200 * time.Millisecond
	}
	t.out = export.NewPipeline(exp, pcfg)
	return nil
}

// run starts discovery and the background loops, reads the ring buffer
// until ctx ends, then flushes what is open and shuts the exporter down.
func (t *agent) run(ctx context.Context, opt Options) error {
	cfg, log := t.cfg, t.log
	var m *metrics.Metrics
	if t.metricsLn != nil {
		m = metrics.New(t.metricSources())
	}
	// Before the metrics server serves: a scrape reads t.gym.
	if err := t.startGymMetrics(ctx, m); err != nil {
		return err
	}
	if m != nil {
		srv := m.Serve(t.metricsLn, log)
		t.undo = append(t.undo, func() {
			// A scrape still being answered gets a moment, not the exit.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
	}

	// Discovery keeps the kernel's target set current.
	w, err := discover.NewWatcher(discover.WatcherOptions{
		PIDs:     t.pids,
		Discover: cfg.Discover,
		OnAdd: func(p *discover.Process) {
			if r := t.roles[p.PID]; r != 0 {
				p.Role = r
			}
			t.addTarget(p)
		},
		OnRemove: t.removeTarget,
		Logger:   log,
	})
	if err != nil {
		return err
	}
	if err := w.Sync(); err != nil {
		return fmt.Errorf("finding target processes: %w", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// feeders make spans and metrics, or write beside the trees: they end
	// before the last spans are flushed. others may be attaching or
	// detaching probes, which takes the kernel a while: they end beside it
	// (finish).
	var feeders, others sync.WaitGroup
	others.Add(1)
	go func() { defer others.Done(); _ = t.tls.Run(runCtx) }() // picks up lazily imported libssl
	others.Add(1)
	go func() {
		defer others.Done()
		if err := w.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("discovery stopped", "err", err)
		}
	}()

	// The targets found now are traced whole before "attached": their
	// interpreters read and their context probes on.
	if !t.py.wait(10 * time.Second) {
		log.Warn("some Python targets are still being inspected; their first requests may lack parents")
	}
	tuneGC(log, os.LookupEnv)
	log.Info("gymtrace: attached", "targets", t.describeTargets(), "span_groups", strings.Join(cfg.Mask.Names(), ","),
		"exporter", cfg.Exporter)
	if m != nil {
		m.SetReady()
	}
	if t.status != nil {
		feeders.Add(1)
		go func() {
			defer feeders.Done()
			t.status.Run(runCtx, time.Second)
		}()
	}
	if opt.Attached != nil {
		opt.Attached()
	}
	if opt.Reloads != nil {
		others.Add(1) // a reload may be attaching probes
		go func() { defer others.Done(); opt.Reloads(runCtx, t.reload) }()
	}
	feeders.Add(1)
	go func() { defer feeders.Done(); t.expireLoop(runCtx) }()
	if t.gym != nil && cfg.PressureInterval > 0 {
		feeders.Add(1)
		go func() { defer feeders.Done(); t.pressureLoop(runCtx, cfg.PressureInterval) }()
	}

	readErr := t.kern.Read(runCtx, func(raw []byte) { t.record(w, raw) })
	stop()
	t.finish(&feeders, &others)
	return readErr
}

// reload applies a reloaded configuration's span groups live, in the kernel
// and in the builder (SIGHUP).
func (t *agent) reload(nc *config.Config) error {
	if err := t.applyMask(nc); err != nil {
		return err
	}
	t.spans.Builder().SetMask(nc.Mask)
	if t.gym != nil {
		t.gym.SetReward(nc.Reward)
	}
	t.setInjectWanted(nc.Mask.Has(groups.HTTPClient))
	t.py.setMask(nc.Mask)
	t.tls.SetEnabled(tlsAllowed(t.kern, nc.Mask))
	t.log.Info("span groups reloaded", "span_groups", strings.Join(nc.Mask.Names(), ","))
	return nil
}

// expireLoop ends idle state so memory stays bounded when traffic stops,
// and releases spans held for a role (internal/spans/roles.go).
func (t *agent) expireLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if step, err := t.clock.Follow(); err != nil {
				t.log.Debug("reading the clocks", "err", err)
			} else if step != 0 {
				t.log.Info("wall clock stepped: span times follow it from now", "by", step)
			}
			t.submit(t.spans.Expire(t.clock.NowMono()))
			if t.gym != nil {
				t.gym.Tick(now)
			}
		}
	}
}

// record handles one ring-buffer record: a lifecycle event, or an HTTP one
// for the span pipeline.
func (t *agent) record(w *discover.Watcher, raw []byte) {
	t.records.Add(1)
	if len(raw) > 0 && loader.IsProcEvent(raw[0]) {
		t.procEvent(w, raw)
	} else {
		out, err := t.spans.Process(raw)
		if err != nil {
			t.log.Debug("undecodable record", "err", err)
		}
		t.submit(out)
	}
	if t.inj != nil && t.kern.Pending() == 0 {
		// Caught up: the trace contexts published for this drain's
		// requests, and the deletes of finished exchanges, go to the
		// kernel in one batch each; an exchange that started and ended
		// within the drain costs no map syscall at all.
		t.inj.Flush()
	}
}
