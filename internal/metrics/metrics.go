// Package metrics exposes gymtrace's own health as Prometheus metrics
// (gymtrace_*), serves them with /healthz on --metrics-addr, and draws a live
// status line on a terminal.
//
// Nothing here sits on the event path: every value is pulled from a provider
// function at scrape time (the kernel's per-CPU counters, the export
// pipeline's counters), so tracing pays nothing for being observable.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// ExportStats are the export pipeline's counters. The fields match
// export.Stats, so metrics.ExportStats(pipeline.Stats()) converts directly.
type ExportStats struct {
	Exported uint64
	Failed   uint64
	Dropped  uint64
	QueueLen int
	QueueCap int
}

// RoleStats are the role-inference counters.
type RoleStats struct {
	Inferred      uint64 // processes whose role their traffic decided
	Held          uint64 // spans held until their process's role was decided
	Undecided     uint64 // server and gym.* spans named by route shape: no role within the bound
	GymUnresolved uint64 // gym.* spans not made: role unknown on a route several kinds serve
}

// GymStats are the counters of Gym's metrics (internal/gymmetrics).
type GymStats struct {
	Processes     int    // processes with Gym metrics now
	SeriesCapped  uint64 // measurements put in the overflow series (the per-process series cap)
	RewardMissing uint64 // successful /verify calls whose reward the kernel did not find
	ProcsCapped   uint64 // spans not measured: too many processes with metrics at once
}

// Sources are the providers read at each scrape. A nil field is not exported.
// Each must be cheap and safe to call from the HTTP server's goroutine.
type Sources struct {
	// EventsEmitted and EventsDiscarded are kernel events per span group:
	// emitted to the ring buffer, and dropped by the group gate.
	EventsEmitted   func() map[string]uint64
	EventsDiscarded func() map[string]uint64
	// RingbufReserveFailures counts records lost for room in the ring
	// buffer: reservations that failed, and response records shed while it
	// was crowded (kept for requests; also kernel_events{response_shed}).
	RingbufReserveFailures func() uint64
	// RecordsRead counts ring-buffer records the agent has read.
	RecordsRead func() uint64
	// KernelCounters are other kernel statistics by reason: not_http,
	// parse_error, resync, ...
	KernelCounters func() map[string]uint64
	// PythonContext are the kernel's asyncio context counters by event:
	// outcomes of context reads (ok, no_thread, ...) and what the probes
	// did (linked, rooted, rooted_read, spawners, uv_writes, ...).
	PythonContext func() map[string]uint64
	// Joins count how server requests found the client request that sent
	// them, by how: traceparent, connection, stream, late, after_end,
	// wait_expired (internal/spans join.go).
	Joins func() map[string]uint64
	// SpansBuilt counts spans made in userspace per group.
	SpansBuilt func() map[string]uint64
	// ParentUnresolved counts client spans left without a parent, by why
	// (the gymtrace.parent.unresolved attribute).
	ParentUnresolved func() map[string]uint64
	// ParentResolved counts client spans given an inbound request as their
	// parent, by how the cause was found.
	ParentResolved func() map[string]uint64
	// ParentNoContext counts those of them made by a process whose asyncio
	// context cannot be read (an unrecognised uvloop build).
	ParentNoContext func() uint64
	// Roles are the processes whose role was inferred from their traffic,
	// and what waiting for it did to their spans (internal/spans/roles.go).
	Roles  func() RoleStats
	Export func() ExportStats
	// Gym is the state of Gym's metrics; nil or a zero value when they are off.
	Gym func() GymStats
	// TargetsAttached is the number of processes being traced now.
	TargetsAttached func() int
	// Injection is whether traceparent injection is on, and why it is off
	// (or forced on despite a kernel misreport).
	Injection func() (on bool, reason string)
	// FeaturesOff are the features this kernel or its build of the BPF
	// programs leaves out, each with what it lacks.
	FeaturesOff func() map[string]string
}

// Metrics is gymtrace's metrics registry and health state.
type Metrics struct {
	reg   *prometheus.Registry
	mu    sync.RWMutex
	src   Sources
	extra []prometheus.Gatherer // served beside reg (Gym's metrics)
	ready atomic.Bool
}

// New registers the gymtrace_* collector, plus the Go runtime and process
// collectors (memory, CPU, file descriptors of gymtrace itself).
func New(src Sources) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), src: src}
	m.reg.MustRegister(&collector{m: m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Update changes the sources, e.g. once the loader is up.
func (m *Metrics) Update(f func(*Sources)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.src)
}

// AddGatherer serves g's metrics on /metrics too, from the next scrape on.
func (m *Metrics) AddGatherer(g prometheus.Gatherer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.extra = append(m.extra, g)
}

// Gather collects gymtrace's own metrics and every added gatherer's.
func (m *Metrics) Gather() ([]*dto.MetricFamily, error) {
	m.mu.RLock()
	gs := append(prometheus.Gatherers{m.reg}, m.extra...)
	m.mu.RUnlock()
	return gs.Gather()
}

// Registry is where the metrics live; callers may register more.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetReady makes /healthz answer 200: call it once probes are attached.
func (m *Metrics) SetReady() { m.ready.Store(true) }

// SetNotReady makes /healthz answer 503 again, e.g. while detaching.
func (m *Metrics) SetNotReady() { m.ready.Store(false) }

// Ready reports what /healthz answers.
func (m *Metrics) Ready() bool { return m.ready.Load() }

// Handler serves /metrics (Prometheus text or protobuf) and /healthz.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !m.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: probes are not attached yet")
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Server is the running metrics endpoint.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// Start listens on addr (host:port, ":9464", "127.0.0.1:0") now, so a port in
// use is an error at startup, and serves in the background.
func (m *Metrics) Start(addr string, log *slog.Logger) (*Server, error) {
	ln, err := Listen(addr)
	if err != nil {
		return nil, err
	}
	return m.Serve(ln, log), nil
}

// Listen opens the metrics port, for Serve: a caller that gives up
// privileges can open a port below 1024 before it does.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving metrics on %q: %w (choose another --metrics-addr, or leave it empty to disable)", addr, err)
	}
	return ln, nil
}

// Serve serves the metrics on ln in the background.
func (m *Metrics) Serve(ln net.Listener, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		srv: &http.Server{
			Handler:           m.Handler(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
		},
		ln:   ln,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "component", "metrics", "error", err)
		}
	}()
	return s
}

// Addr is the address the server listens on (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Shutdown stops the server, waiting for scrapes in progress while ctx allows.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	<-s.done
	if err != nil {
		return fmt.Errorf("stopping the metrics server: %w", err)
	}
	return nil
}

var (
	descEmitted = prometheus.NewDesc("gymtrace_events_emitted_total",
		"Kernel HTTP events sent to the ring buffer, per span group.", []string{"group"}, nil)
	descDiscarded = prometheus.NewDesc("gymtrace_events_discarded_total",
		"Kernel HTTP events dropped by the span-group gate before any ring-buffer reservation, per span group.", []string{"group"}, nil)
	descRingbuf = prometheus.NewDesc("gymtrace_ringbuf_reserve_failures_total",
		"Records lost for room in the ring buffer: reservations that failed with the buffer full, and response records not written with it seven eighths full (its last eighth kept for requests; also gymtrace_kernel_events_total{reason=\"response_shed\"}). A request record that failed here may still arrive late (at its handler's first call or its response): gymtrace_kernel_events_total{reason=\"request_late\"}.", nil, nil)
	descRecords = prometheus.NewDesc("gymtrace_ringbuf_records_read_total",
		"Records read from the kernel's ring buffer (HTTP messages and process events).", nil, nil)
	descKernel = prometheus.NewDesc("gymtrace_kernel_events_total",
		"Other kernel-side counters by reason (not_http, parse_error, resync, ...).", []string{"reason"}, nil)
	descPython = prometheus.NewDesc("gymtrace_python_context_total",
		"Kernel asyncio-context work in traced Python processes, by event: context reads at syscalls (ok, not_python, no_thread, "+
			"no_context, bad_context, read_error, walked), the context-copy probe (linked; rooted and rooted_read: request handlers bound "+
			"by the spawner and read rules; spawners), and uvloop's write probe (uv_writes, uv_taken, uv_skipped).", []string{"event"}, nil)
	descJoins = prometheus.NewDesc("gymtrace_server_joins_total",
		"How server requests were joined to the request that sent them, only ever by proof: traceparent (in-band), "+
			"connection (a client request on this node, by the 4-tuple), stream (... of which by the same TCP stream "+
			"position), index (... by the same request index on a connection both ends followed whole: TLS), late (... of "+
			"which the client's record came second), after_end (... after the server had answered), awaited (finished "+
			"server requests kept for a client record not read yet), wait_expired (... that did not come: exported "+
			"without that parent), unprovable (requests dropped unjoined from a connection's queue: no proof matched).",
		[]string{"how"}, nil)
	descBuilt = prometheus.NewDesc("gymtrace_spans_built_total",
		"Spans built in userspace, per span group.", []string{"group"}, nil)
	descUnresolved = prometheus.NewDesc("gymtrace_parent_unresolved_total",
		"Client spans exported without a parent because their cause could not be proven, by reason (their "+
			"gymtrace.parent.unresolved attribute): ambiguous (several requests in flight, no context), "+
			"request_not_traced (the request the kernel named has no record: gated off, lost, or before attach), "+
			"context_unbound (the call's asyncio context is bound to no traced request), records_lost (the process "+
			"lost records, so what is in flight proves nothing), cause_after_call (the request the kernel named began after "+
			"the call: a binding that cannot be right).", []string{"reason"}, nil)
	descResolved = prometheus.NewDesc("gymtrace_parent_resolved_total",
		"Client spans whose parent is the inbound request that caused them, by how the cause was found: context "+
			"(the kernel bound the call to its request through the asyncio context), nesting (no context: the "+
			"innermost of one chain of requests in flight), only_in_flight (no context: the one request in flight "+
			"in the process). The last two are inferences, made only for processes whose records carry no context "+
			"and have lost none.", []string{"how"}, nil)
	descNoContext = prometheus.NewDesc("gymtrace_parent_no_context_total",
		"Client spans left without a parent because their process's asyncio context cannot be read "+
			"(an unrecognised uvloop build; gymtrace.parent.unresolved=uvloop_unrecognized).", nil, nil)
	descRolesInferred = prometheus.NewDesc("gymtrace_roles_inferred_total",
		"Processes whose Gym role was inferred from their traffic (no config, no Gym environment).", nil, nil)
	descRoleHeld = prometheus.NewDesc("gymtrace_role_held_spans_total",
		"Spans held until their process's role was decided, so that all its spans are named the same way.", nil, nil)
	descRoleUndecided = prometheus.NewDesc("gymtrace_role_undecided_spans_total",
		"Server spans named by route shape alone: their process's role was not decided within the hold bound "+
			"(3 s or 256 spans). Give the role with --pid PID=ROLE.", nil, nil)
	descGymUnresolved = prometheus.NewDesc("gymtrace_gym_span_unresolved_total",
		"gym.* spans not made because the process's role is unknown and several kinds of server share the route.", nil, nil)
	descExported = prometheus.NewDesc("gymtrace_spans_exported_total",
		"Spans the exporter accepted.", nil, nil)
	descFailed = prometheus.NewDesc("gymtrace_spans_export_failed_total",
		"Spans given up after export retries, or unsent at shutdown.", nil, nil)
	descDropped = prometheus.NewDesc("gymtrace_spans_dropped_total",
		"Spans dropped because the export queue was full.", nil, nil)
	descQueueLen = prometheus.NewDesc("gymtrace_export_queue_length",
		"Spans waiting to be exported, including a batch being retried.", nil, nil)
	descQueueCap = prometheus.NewDesc("gymtrace_export_queue_capacity",
		"Size of the export queue.", nil, nil)
	descTargets = prometheus.NewDesc("gymtrace_targets_attached",
		"Processes being traced.", nil, nil)
	descInject = prometheus.NewDesc("gymtrace_inject_enabled",
		"1 when traceparent injection is on. reason: why it is off (flag, fionread: the kernel misreports FIONREAD for sockets in a sockhash, "+
			"selftest_failed, no_cgroup_v2, kernel_unsupported, attach_failed), or forced_<reason> when --inject-force overrode the self-test.", []string{"reason"}, nil)
	descGymProcs = prometheus.NewDesc("gymtrace_gym_metrics_processes",
		"Processes Gym's metrics are kept for (one resource each).", nil, nil)
	descGymCapped = prometheus.NewDesc("gymtrace_gym_metric_series_capped_total",
		"Measurements of Gym's metrics recorded in the otel.metric.overflow series because a process reached "+
			"the cap on distinct attribute sets per instrument (raw paths on a route without a template?).", nil, nil)
	descRewardMissing = prometheus.NewDesc("gymtrace_gym_reward_missing_total",
		"Successful /verify responses whose reward the kernel did not find (not at the top level of the body's "+
			"last window, cut by a write boundary, or chunked): nothing was recorded for them.", nil, nil)
	descGymProcsCapped = prometheus.NewDesc("gymtrace_gym_metrics_procs_capped_total",
		"Spans not measured for Gym's metrics because too many processes had metrics at once.", nil, nil)
	descFeatureOff = prometheus.NewDesc("gymtrace_kernel_feature_off",
		"1 for each feature this kernel (or the build of the BPF programs it gets) leaves out: feature names it, needs says what the kernel lacks "+
			"(gymtrace check and the start-up log name the same).", []string{"feature", "needs"}, nil)
	descReady = prometheus.NewDesc("gymtrace_ready",
		"1 once probes are attached (what /healthz reports).", nil, nil)
)

// collector reads the sources at scrape time.
type collector struct{ m *Metrics }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEmitted, descDiscarded, descRingbuf, descRecords, descKernel, descPython, descBuilt,
		descUnresolved, descResolved, descNoContext, descRolesInferred, descRoleHeld, descRoleUndecided, descGymUnresolved, descExported, descFailed, descDropped, descQueueLen, descQueueCap, descTargets, descInject,
		descGymProcs, descGymCapped, descRewardMissing, descGymProcsCapped, descFeatureOff, descReady} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.RLock()
	src := c.m.src
	c.m.mu.RUnlock()

	perLabel := func(d *prometheus.Desc, f func() map[string]uint64) {
		if f == nil {
			return
		}
		for k, v := range f() {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), k)
		}
	}
	counter := func(d *prometheus.Desc, f func() uint64) {
		if f != nil {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(f()))
		}
	}
	perLabel(descEmitted, src.EventsEmitted)
	perLabel(descDiscarded, src.EventsDiscarded)
	perLabel(descKernel, src.KernelCounters)
	perLabel(descPython, src.PythonContext)
	perLabel(descBuilt, src.SpansBuilt)
	perLabel(descJoins, src.Joins)
	counter(descRingbuf, src.RingbufReserveFailures)
	counter(descRecords, src.RecordsRead)
	perLabel(descUnresolved, src.ParentUnresolved)
	perLabel(descResolved, src.ParentResolved)
	counter(descNoContext, src.ParentNoContext)
	if src.Roles != nil {
		r := src.Roles()
		for d, v := range map[*prometheus.Desc]uint64{descRolesInferred: r.Inferred, descRoleHeld: r.Held,
			descRoleUndecided: r.Undecided, descGymUnresolved: r.GymUnresolved} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
		}
	}
	if src.Gym != nil {
		g := src.Gym()
		ch <- prometheus.MustNewConstMetric(descGymProcs, prometheus.GaugeValue, float64(g.Processes))
		ch <- prometheus.MustNewConstMetric(descGymCapped, prometheus.CounterValue, float64(g.SeriesCapped))
		ch <- prometheus.MustNewConstMetric(descRewardMissing, prometheus.CounterValue, float64(g.RewardMissing))
		ch <- prometheus.MustNewConstMetric(descGymProcsCapped, prometheus.CounterValue, float64(g.ProcsCapped))
	}
	if src.Export != nil {
		s := src.Export()
		ch <- prometheus.MustNewConstMetric(descExported, prometheus.CounterValue, float64(s.Exported))
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(s.Failed))
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.Dropped))
		ch <- prometheus.MustNewConstMetric(descQueueLen, prometheus.GaugeValue, float64(s.QueueLen))
		ch <- prometheus.MustNewConstMetric(descQueueCap, prometheus.GaugeValue, float64(s.QueueCap))
	}
	if src.TargetsAttached != nil {
		ch <- prometheus.MustNewConstMetric(descTargets, prometheus.GaugeValue, float64(src.TargetsAttached()))
	}
	if src.Injection != nil {
		on, reason := src.Injection()
		v := 0.0
		if on {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descInject, prometheus.GaugeValue, v, reason)
	}
	if src.FeaturesOff != nil {
		for f, needs := range src.FeaturesOff() {
			ch <- prometheus.MustNewConstMetric(descFeatureOff, prometheus.GaugeValue, 1, f, needs)
		}
	}
	ready := 0.0
	if c.m.ready.Load() {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
}
