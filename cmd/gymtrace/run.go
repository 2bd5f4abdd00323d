//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/export"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/metrics"
	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/internal/privs"
	"github.com/gymtrace/gymtrace/internal/spans"
	gttls "github.com/gymtrace/gymtrace/internal/tls"
)

// tracer is one running gymtrace: discovery feeds targets to the loader, the
// ring-buffer reader feeds the span pipeline, the pipeline feeds the exporter.
type tracer struct {
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
	out       *export.Pipeline

	py *pyTargets

	records atomic.Uint64 // ring-buffer records read

	mu    sync.RWMutex
	procs map[int]*discover.Process
}

// runTracer is `gymtrace run`: attach, trace until ctx ends, flush, detach.
func runTracer(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	return runTracerTo(ctx, cfg, log, os.Stdout, nil)
}

// runTracerTo is runTracer with the terminal writer given (the demo prints
// its own banner around the trees) and a hook called once attached.
func runTracerTo(ctx context.Context, cfg *config.Config, log *slog.Logger, term io.Writer, attached func(*tracer)) error {
	if err := preflight.Required(ctx); err != nil {
		return err
	}
	t := &tracer{log: log, cfg: cfg, procs: map[int]*discover.Process{}}

	// Explicit --pid targets must exist: say so before attaching anything.
	var pids []int
	roles := map[int]uint8{}
	for _, pr := range cfg.PIDs {
		if _, err := discover.Inspect(pr.PID); err != nil {
			return usageError{fmt.Errorf("--pid %d: %w", pr.PID, err)}
		}
		pids = append(pids, pr.PID)
		roles[pr.PID] = pr.Role
	}

	kern, err := loader.Load(loader.Options{RingbufBytes: cfg.RingbufBytes, Log: log})
	if err != nil {
		return err
	}
	t.kern = kern
	defer kern.Close()
	t.py = newPyTargets(t, cfg.Mask)
	defer t.py.close()
	if err := kern.SetRoutes(routeTable()); err != nil {
		return err
	}
	if err := t.applyMask(cfg.Mask, cfg.RolloutIDs); err != nil {
		return err
	}
	if t.tls, err = newTLSAttacher(kern, cfg.Mask, log); err != nil {
		return err
	}
	defer t.tls.Close()
	t.inj = startInjector(kern, cfg, log, &t.injState)
	t.injWanted.Store(cfg.Mask.Has(groups.HTTPClient))
	defer func() {
		if err := t.inj.Close(); err != nil {
			log.Debug("detaching traceparent injection", "err", err)
		}
	}()
	// The metrics port is opened now (a port below 1024 needs
	// CAP_NET_BIND_SERVICE) and served once the pipeline exists.
	var metricsLn net.Listener
	if cfg.MetricsAddr != "" {
		if metricsLn, err = metrics.Listen(cfg.MetricsAddr); err != nil {
			return err
		}
		defer metricsLn.Close()
	}
	// Everything that needs more than the run's own capabilities is
	// attached: drop the rest now, before the exporter, metrics and
	// discovery start goroutines (libcap's psx applies the change to every
	// thread with signals; with few threads there are few to race with).
	privs.DropAfterAttach(log, privs.Needs{Discovery: true, Uprobes: tlsWanted(cfg.Mask) || needsPy(cfg.Mask)})

	// Userspace pipeline and exporter.
	b, err := spans.NewBuilder(spans.Options{
		Mask:    cfg.Mask,
		Lookup:  t.lookup,
		Sampler: sampler(cfg.SampleRatio),
		Logger:  log.With("component", "spans"),
		Inject:  builderInjector(t.inj),
	})
	if err != nil {
		return fmt.Errorf("starting the span builder: %w", err)
	}
	t.spans = spans.NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
	// On a terminal, a live status line under the trace trees.
	var status *metrics.StatusLine
	if f, ok := term.(*os.File); ok && metrics.IsTerminal(f) {
		status = metrics.NewStatusLine(f, t.statusSnapshot)
		term = status
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

	var m *metrics.Metrics
	if cfg.MetricsAddr != "" {
		m = metrics.New(t.metricSources())
		srv := m.Serve(metricsLn, log)
		defer srv.Shutdown(context.Background())
	}

	// Discovery keeps the kernel's target set current.
	w, err := discover.NewWatcher(discover.WatcherOptions{
		PIDs:     pids,
		Discover: cfg.Discover,
		OnAdd: func(p *discover.Process) {
			if r := roles[p.PID]; r != 0 {
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
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = t.tls.Run(runCtx) }() // picks up lazily imported libssl
	wg.Add(1)
	go func() {
		defer wg.Done()
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
	if status != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status.Run(runCtx, time.Second)
		}()
	}
	if attached != nil {
		attached(t)
	}

	// SIGHUP: new groups apply live, in the kernel and in the builder.
	wg.Add(1)
	go func() {
		defer wg.Done()
		watchReloads(runCtx, log, func(nc *config.Config) error {
			if err := t.applyMask(nc.Mask, nc.RolloutIDs); err != nil {
				return err
			}
			t.spans.Builder().SetMask(nc.Mask)
			t.setInjectWanted(nc.Mask.Has(groups.HTTPClient))
			t.py.setMask(nc.Mask)
			t.tls.SetEnabled(tlsWanted(nc.Mask))
			log.Info("span groups reloaded", "span_groups", strings.Join(nc.Mask.Names(), ","))
			return nil
		})
	}()

	// Expire idle state so memory stays bounded when traffic stops.
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second) // also releases spans held for a role (internal/spans/roles.go)
		defer tick.Stop()
		clock, err := http.NewClock()
		if err != nil {
			return
		}
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
				t.submit(t.spans.Expire(clock.NowMono()))
			}
		}
	}()

	readErr := kern.Read(runCtx, func(raw []byte) {
		t.records.Add(1)
		if len(raw) > 0 && loader.IsProcEvent(raw[0]) {
			t.procEvent(w, raw)
		} else {
			out, err := t.spans.Process(raw)
			if err != nil {
				log.Debug("undecodable record", "err", err)
			}
			t.submit(out)
		}
		if t.inj != nil && kern.Pending() == 0 {
			// Caught up: the trace contexts published for this drain's
			// requests, and the deletes of finished exchanges, go to the
			// kernel in one batch each; an exchange that started and ended
			// within the drain costs no map syscall at all.
			t.inj.Flush()
		}
	})
	stop()
	wg.Wait()

	// Flush: spans still open are ended now, marked truncated, as Gym does.
	t.submit(t.spans.Flush())
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.out.Shutdown(sctx); err != nil {
		log.Warn("exporter shutdown", "err", err)
	}
	st := t.out.Stats()
	for _, r := range t.kern.ProfTable() {
		log.Info("bpf section", "name", r.Name, "runs", r.Count, "ns_per_run", int(r.NsPer))
	}
	log.Info("gymtrace: detached", "spans_exported", st.Exported, "spans_failed", st.Failed, "spans_dropped", st.Dropped)
	return readErr
}

// procEvent handles a lifecycle record: discovery learns of forks, execs and
// exits at once instead of at its next rescan.
func (t *tracer) procEvent(w *discover.Watcher, raw []byte) {
	if len(raw) < loader.ProcEventSize {
		return
	}
	var ev loader.ProcEvent
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.ProcEventSize), raw)
	switch ev.Kind {
	case loader.EvProcFork:
		// The kernel already traces the child with its parent's role; until
		// discovery inspects it, it is known by its parent's identity (a
		// uvicorn worker serves as its parent's server).
		if parent := t.lookup(int(ev.Ppid)); parent != nil && t.lookup(int(ev.Pid)) == nil {
			child := *parent
			child.PID, child.NSPID, child.PPID, child.Worker = int(ev.Pid), 0, parent.PID, true
			t.mu.Lock()
			t.procs[child.PID] = &child
			t.mu.Unlock()
		}
		w.OnFork(int(ev.Pid))
	case loader.EvProcExec:
		w.OnExec(int(ev.Pid))
	case loader.EvProcExit:
		w.OnExit(int(ev.Pid))
		// A target the watcher found is removed, connection state
		// included, by its own goroutine (removeTarget); only processes it
		// does not own (workers, children) are forgotten here, so the map
		// walk runs once per exit and not on this reader for those.
		p := t.lookup(int(ev.Pid))
		if p == nil || p.Worker {
			t.kern.ProcessExited(int(ev.Pid))
		}
		if p != nil && p.Worker {
			t.mu.Lock()
			delete(t.procs, int(ev.Pid))
			t.mu.Unlock()
		}
	}
	t.submit(t.spans.Builder().ProcEvent(&ev))
}

// statusSnapshot feeds the terminal status line.
func (t *tracer) statusSnapshot() metrics.Snapshot {
	st := t.spans.Builder().Stats()
	snap := metrics.Snapshot{Targets: t.targetCount(), Spans: map[string]uint64{}}
	for _, info := range groups.All() {
		if n := st.Spans[info.Group]; n > 0 {
			snap.Spans[info.Name] = n
		}
	}
	ex := t.out.Stats()
	snap.Drops = t.kernelStats()[loader.StatRingbufFull] + ex.Dropped + ex.Failed
	return snap
}

func (t *tracer) submit(s []spans.Span) {
	if len(s) > 0 {
		t.out.Submit(s...)
	}
}

func (t *tracer) lookup(pid int) *discover.Process {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.procs[pid]
}

func (t *tracer) addTarget(p *discover.Process) {
	t.mu.Lock()
	t.procs[p.PID] = p
	t.mu.Unlock()
	if err := t.kern.AddTarget(p.PID, p.Role); err != nil {
		t.log.Warn("cannot trace process", "pid", p.PID, "err", err)
		return
	}
	if t.injWanted.Load() {
		t.adoptConnections(p.PID)
	}
	t.py.add(p.PID)
	if p.Role == loader.RoleOrchestrator && t.spans != nil {
		// Its calls carry its gym.job's trace from the first one on.
		t.spans.Builder().PrepareJob(p.PID)
	}
	t.log.Info("tracing", "pid", p.PID, "service", p.ServiceName(), "type", p.ServerType())
	_ = t.tls.Add(p.PID) // failures are logged by the attacher; plain HTTP is traced regardless
}

// adoptConnections puts pid's pooled keep-alive connections from before now
// in the injection sockhash; otherwise they would never carry traceparent
// (sock_ops sees only new ones).
func (t *tracer) adoptConnections(pid int) {
	if n, err := t.inj.AdoptConnections(pid); err != nil {
		t.log.Warn("cannot add the process's existing connections to traceparent injection; they get no header until replaced",
			"pid", pid, "adopted", n, "err", err)
	} else if n > 0 {
		t.log.Info("existing outbound connections adopted for traceparent injection", "pid", pid, "connections", n)
	}
}

// setInjectWanted follows a reload: without http_client the targets'
// sockets leave the injection sockhash (their writes take the plain TCP
// path again); with it back, their open connections are adopted again.
func (t *tracer) setInjectWanted(on bool) {
	if t.inj == nil || t.injWanted.Swap(on) == on {
		return
	}
	if !on {
		if err := t.inj.ReleaseConnections(); err != nil {
			t.log.Warn("emptying the injection sockhash", "err", err)
		}
		return
	}
	t.mu.RLock()
	pids := slices.Collect(maps.Keys(t.procs))
	t.mu.RUnlock()
	for _, pid := range pids {
		t.adoptConnections(pid)
	}
}

func (t *tracer) removeTarget(p *discover.Process) {
	t.tls.Remove(p.PID)
	if err := t.kern.RemoveTarget(p.PID); err != nil {
		t.log.Warn("removing target", "pid", p.PID, "err", err)
	}
	t.py.remove(p.PID)
	t.mu.Lock()
	delete(t.procs, p.PID)
	t.mu.Unlock()
	t.spans.Builder().ForgetProcess(p.PID)
	t.log.Info("process gone", "pid", p.PID, "service", p.ServiceName())
}

func (t *tracer) targetCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.procs)
}

func (t *tracer) describeTargets() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var parts []string
	for pid, p := range t.procs {
		parts = append(parts, fmt.Sprintf("%d=%s", pid, p.ServiceName()))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none yet (waiting for Gym servers)"
	}
	return strings.Join(parts, " ")
}

// applyMask writes the gate: the mask and, per role, which groups an inbound
// or outbound message could belong to at all.
func (t *tracer) applyMask(m groups.Mask, rolloutIDs bool) error {
	var sp [8]uint64
	for r := range sp {
		sp[r] = uint64(groups.ServerPossible(groups.Role(r)))
	}
	var flags uint32
	if rolloutIDs {
		flags |= loader.CfgRolloutIDs
	}
	// Benchmarks only (scripts/bench): copy every message out and let the
	// builder filter, to measure what the in-kernel gate saves.
	if os.Getenv("GYMTRACE_BENCH_NO_GATE") == "1" {
		flags |= loader.CfgNoGate
	}
	return t.kern.SetGate(uint64(m), sp, uint64(groups.ClientPossible()), flags)
}

// routeTable is the kernel's (role, method, path) -> gym.* group table, from
// Gym's routes. Keys hold paths with any /ng-rollout/<id> prefix removed, as
// the kernel looks them up; role 0 (not yet known) gets the union over roles.
func routeTable() map[loader.RouteKey]uint64 {
	out := map[loader.RouteKey]uint64{}
	for _, r := range groups.GymRoutes() {
		path, _ := groups.StripRolloutPrefix(r.Path)
		m := methodCode(r.Method)
		out[loader.NewRouteKey(uint8(r.Role), m, path)] |= uint64(r.Groups)
		out[loader.NewRouteKey(loader.RoleUnknown, m, path)] |= uint64(r.Groups)
	}
	return out
}

func methodCode(m string) uint8 {
	switch m {
	case "GET":
		return loader.MethodGET
	case "POST":
		return loader.MethodPOST
	case "PUT":
		return loader.MethodPUT
	case "DELETE":
		return loader.MethodDELETE
	case "PATCH":
		return loader.MethodPATCH
	case "HEAD":
		return loader.MethodHEAD
	case "OPTIONS":
		return loader.MethodOPTIONS
	}
	return loader.MethodUnknown
}

func sampler(ratio float64) sdktrace.Sampler {
	if ratio >= 1 {
		return nil
	}
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
}

func newExporter(ctx context.Context, cfg *config.Config, term io.Writer, log *slog.Logger) (export.Exporter, error) {
	res := export.NewResources("")
	switch cfg.Exporter {
	case config.ExporterOTLP:
		e, err := export.NewOTLP(ctx, export.OTLPConfig{
			Endpoint:  cfg.OTLPEndpoint,
			Insecure:  cfg.OTLPInsecure,
			Headers:   cfg.OTLPHeaders,
			Timeout:   cfg.OTLPTimeout,
			Resources: res,
		})
		if err != nil {
			return nil, fmt.Errorf("setting up the OTLP exporter: %w", err)
		}
		return e, nil
	case config.ExporterJSONL:
		e, err := export.OpenJSONL(cfg.Output, res)
		if err != nil {
			return nil, err
		}
		return e, nil
	default:
		w := term
		if cfg.Output != "" && cfg.Output != "-" {
			f, err := os.OpenFile(cfg.Output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return nil, fmt.Errorf("opening %s for the trace tree: %w", cfg.Output, err)
			}
			w = f
		}
		return export.NewTree(w, export.TreeConfig{Logger: log.With("component", "tree")}), nil
	}
}

func (t *tracer) kernelStats() []uint64 {
	st, err := t.kern.Stats()
	if err != nil {
		return make([]uint64, loader.StatMax)
	}
	return st
}

func (t *tracer) metricSources() metrics.Sources {
	perGroup := func(base uint32) func() map[string]uint64 {
		return func() map[string]uint64 {
			st := t.kernelStats()
			out := map[string]uint64{}
			for _, info := range groups.All() {
				out[info.Name] = st[base+uint32(info.Group)]
			}
			return out
		}
	}
	return metrics.Sources{
		EventsEmitted:          perGroup(loader.StatEmitted),
		EventsDiscarded:        perGroup(loader.StatDiscarded),
		RingbufReserveFailures: func() uint64 { return t.kernelStats()[loader.StatRingbufFull] },
		RecordsRead:            func() uint64 { return t.records.Load() },
		KernelCounters: func() map[string]uint64 {
			st := t.kernelStats()
			out := map[string]uint64{
				"not_http":      st[loader.StatNotHTTP],
				"parse_error":   st[loader.StatParseError],
				"hdr_truncated": st[loader.StatHdrTruncated],
				"conn_full":     st[loader.StatConnFull],
				"resync":        st[loader.StatResync],
				"skipped_bytes": st[loader.StatSkippedBytes],
				"unsampled":     st[loader.StatUnsampled],
				"scan_reused":   st[loader.StatScanReused], // client request heads not read twice (injection's scan)
				"fresh_conns":   st[loader.StatFresh],      // connections followed from their first byte: joined by order
				"tls_calls":     st[loader.StatTLSCalls],   // OpenSSL probe runs in targets
				"tls_events":    st[loader.StatTLSEvents],  // records from TLS plaintext
				"tls_linked":    st[loader.StatTLSLinked],  // SSL objects tied to their socket
			}
			injectCounters(t.inj, out)
			return out
		},
		SpansBuilt: func() map[string]uint64 {
			st := t.spans.Builder().Stats()
			out := map[string]uint64{}
			for _, info := range groups.All() {
				out[info.Name] = st.Spans[info.Group]
			}
			return out
		},
		ParentUnresolved: func() uint64 { return t.spans.Builder().Stats().ParentAmbiguous },
		ParentNoContext:  func() uint64 { return t.spans.Builder().Stats().ParentNoContext },
		Roles: func() metrics.RoleStats {
			st := t.spans.Builder().Stats()
			return metrics.RoleStats{Inferred: st.RoleInferred, Held: st.Held, Undecided: st.RoleUndecided, GymUnresolved: st.GymSpanUnresolved}
		},
		Export:          func() metrics.ExportStats { return metrics.ExportStats(t.out.Stats()) },
		TargetsAttached: t.targetCount,
		Injection:       t.injState.get,
	}
}
