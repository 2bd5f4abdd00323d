//go:build linux

// Package loader loads gymtrace's BPF objects, attaches them, owns their maps
// and reads the ring buffer. It knows nothing of spans: records leave it as
// raw bytes for internal/http to decode.
package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Options tune the kernel side. Zero values take the compiled-in defaults.
type Options struct {
	RingbufBytes int // power of two, multiple of the page size
	MaxConns     int // connection-table entries (LRU)
	Log          *slog.Logger
}

// Tracer is the loaded and attached kernel side.
type Tracer struct {
	objs  bpfObjects
	links []link.Link
	rd    *ringbuf.Reader
	// rdMu guards rd's closing against AvailableBytes, which reads the
	// mapped ring without the reader's own lock.
	rdMu     sync.RWMutex
	rdClosed bool
	log      *slog.Logger

	mu  sync.Mutex
	cfg Config

	variant     Variant       // the build of bpf/gymtrace.c this kernel got
	unsupported []Unsupported // programs loaded as no-ops: this kernel cannot run them
	preempt     Preemption    // what the kernel does to uprobe programs halfway (preempt.go)
	ops         *MapOps       // the thread every run-time map operation runs on (mapops.go)

	profTime bool // GYMTRACE_PROF_TIME=1: the programs time their sections (ProfTable)

	// The kernel's forced ring-buffer wakeups, through Go's netpoller (see Read).
	wakeFile *os.File
	wakeOnce sync.Once
	wakeCh   chan struct{}
	// pollEvery replaces PollInterval when set, and the reader does not back
	// off from it (tests: a reader that only wakeups can move, or one that
	// looks often, so that waiting for its drains is quick).
	pollEvery time.Duration
	// lagging (GYMTRACE_TEST_LAGGING_READER=1, tests only): the reader
	// falls behind on purpose until the ring overflows (see lag).
	lagging bool
	lagPer  []uint64 // refused's per-CPU buffer (the reader's goroutine alone)
	// drained (tests only) is called by Read each time a drain has left
	// the ring empty, after delivering what it read: a barrier that does
	// not depend on how long a busy machine keeps the reader off the CPU.
	drained func()
}

// Load loads the BPF objects into the kernel and attaches every program.
// Nothing is pinned: all of it goes away with the process, even on SIGKILL.
func Load(opts Options) (*Tracer, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("removing the memlock limit (needs CAP_SYS_RESOURCE on kernels before 5.11): %w", err)
	}
	variant, why, err := PickVariant()
	if err != nil {
		return nil, err
	}
	spec, err := variant.Spec()
	if err != nil {
		return nil, err
	}
	log.Debug("BPF objects", "variant", variant.Name, "why", why)
	unsupported := stubUnsupported(spec, variant)
	for _, u := range unsupported {
		log.Debug("BPF program left out: this kernel lacks what it needs", "program", u.Program, "needs", u.Needs, "off", u.Feature)
	}
	for _, u := range offFeatures(variant, unsupported) {
		log.Warn("feature off on this kernel", "feature", u.Feature, "needs", u.Needs, "bpf_build", variant.Name)
	}
	if opts.RingbufBytes > 0 {
		n := opts.RingbufBytes
		if n&(n-1) != 0 || n < os.Getpagesize() {
			return nil, fmt.Errorf("ring buffer size %d: must be a power of two and at least %d bytes", n, os.Getpagesize())
		}
		spec.Maps["gt_events"].MaxEntries = uint32(n)
	}
	// Records wake the reader only once a quarter of the buffer is pending;
	// otherwise Read's poll picks them up (see gt_submit).
	if err := spec.Variables["gt_wakeup_bytes"].Set(uint64(spec.Maps["gt_events"].MaxEntries / 4)); err != nil {
		return nil, fmt.Errorf("configuring ring-buffer wakeups: %w", err)
	}
	// Response records stop at seven eighths pending: the last eighth is
	// for request records, whose loss costs a span (gt_shed_bytes).
	if err := spec.Variables["gt_shed_bytes"].Set(uint64(spec.Maps["gt_events"].MaxEntries / 8 * 7)); err != nil {
		return nil, fmt.Errorf("configuring ring-buffer shedding: %w", err)
	}
	if opts.MaxConns > 0 {
		spec.Maps["gt_conns"].MaxEntries = uint32(opts.MaxConns)
	}
	if v := os.Getenv("GYMTRACE_PROF_SKIP"); v != "" {
		// Cost experiments only (see bench_test.go): switch parts of the
		// parser off to see what they cost.
		var n uint32
		fmt.Sscan(v, &n)
		if err := spec.Variables["gt_prof_skip"].Set(n); err != nil {
			return nil, err
		}
	}
	profTime := os.Getenv("GYMTRACE_PROF_TIME") == "1"
	if profTime && variant.Name == variantBounded.Name {
		log.Warn("GYMTRACE_PROF_TIME: the bounded-loop build of the BPF programs has no section timers (their stack slots do not fit 6.1's verifier); no timings")
		profTime = false
	}
	if profTime {
		// Cost experiments only: time the parser's sections (ProfTable).
		if err := spec.Variables["gt_prof_time"].Set(uint32(1)); err != nil {
			return nil, err
		}
	}
	preempt := probePreemption()
	if err := applyPreemption(spec, preempt); err != nil {
		return nil, err
	}
	log.Debug("kernel preemption", "preempts", preempt.Preempts, "mode", preempt.Mode,
		"bpf_preempt_disable", preempt.Kfunc, "tls_pinned", preempt.PinTLS)
	// The uprobe programs (Python, uvloop, TLS) as uprobe_multi programs
	// where the kernel has them: a process's probes come off together.
	probesite.PrepareMulti(spec)
	t := &Tracer{log: log, profTime: profTime, variant: variant, unsupported: unsupported, preempt: preempt}
	if os.Getenv("GYMTRACE_TEST_LAGGING_READER") == "1" {
		// Loss tests only: records are lost on purpose.
		log.Warn("GYMTRACE_TEST_LAGGING_READER: the ring-buffer reader lags until the ring overflows; records will be lost")
		t.lagging = true
	}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading BPF objects (%s build): the kernel's verifier refused them (`gymtrace check` says which program, and why):\n%+v", variant.Name, ve)
		}
		return nil, fmt.Errorf("loading BPF objects (%s build): %w", variant.Name, err)
	}
	for _, tp := range t.tracepoints() {
		if err := t.attachSyscall(tp); err != nil {
			t.Close()
			return nil, err
		}
	}
	if t.understudies() {
		// Injection's sys_enter programs (attached by internal/inject,
		// their understudies after them) take their slots now.
		for slot, p := range map[uint32]*ebpf.Program{SysInjectWrite: t.objs.GtInjectEnterWrite, SysInjectSendto: t.objs.GtInjectEnterSendto,
			SysInjectWritev: t.objs.GtInjectEnterWritev, SysInjectSendmsg: t.objs.GtInjectEnterSendmsg} {
			if p == nil {
				continue
			}
			if err := t.objs.GtSysTails.Put(slot, p); err != nil {
				t.Close()
				return nil, fmt.Errorf("giving injection's understudies their programs: %w", err)
			}
		}
	}
	// Process lifecycle: children of targets, sandbox CLIs, exits.
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{{"sched_process_exec", t.objs.GtExec}, {"sched_process_exit", t.objs.GtExit}} {
		l, err := link.Tracepoint("sched", tp.name, tp.prog, nil)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching tracepoint sched/%s: %w", tp.name, err)
		}
		t.links = append(t.links, l)
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_process_fork", Program: t.objs.GtFork})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("attaching raw tracepoint sched_process_fork: %w", err)
	}
	t.links = append(t.links, l)
	rd, err := ringbuf.NewReader(t.objs.GtEvents)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("opening the ring buffer: %w", err)
	}
	t.rd = rd
	t.ops = NewMapOps(preempt.Preempts)
	if rt, why := t.ops.RealTime(); preempt.Preempts && !rt {
		t.log.Warn("map operations run at normal priority on a kernel that preempts: while one is preempted the kernel skips gymtrace's programs on its CPU (gymtrace_kernel_events_total{reason=\"program_skipped\"})", "preemption", preempt.Mode, "err", why)
	}
	if t.wakeFile, err = newWakeFile(t.objs.GtEvents.FD()); err != nil {
		t.log.Debug("ring-buffer wakeups unavailable: polling only", "err", err)
	}
	return t, nil
}

// SetGate writes the gate configuration. Every call bumps the generation, so
// connections mid-message resynchronise at their next message start.
func (t *Tracer) SetGate(mask uint64, serverPossible [8]uint64, clientPossible uint64, flags uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg.Mask = mask
	t.cfg.ServerPossible = serverPossible
	t.cfg.ClientPossible = clientPossible
	t.cfg.Flags = flags
	t.cfg.Generation++
	if err := t.ops.Do(func() error { return t.objs.GtConfig.Put(uint32(0), &t.cfg) }); err != nil {
		return fmt.Errorf("writing the span-group gate: %w", err)
	}
	return nil
}

// NewRouteKey builds a route-table key; paths longer than the key are cut.
func NewRouteKey(role, method uint8, path string) RouteKey {
	k := RouteKey{Role: role, Method: method}
	copy(k.Path[:], path)
	return k
}

// SetRoutes replaces the route table: (role, method, path) -> group bits.
func (t *Tracer) SetRoutes(routes map[RouteKey]uint64) error {
	var stale []RouteKey
	walkKeys(t.objs.GtRoutes, func(k RouteKey) {
		if _, ok := routes[k]; !ok {
			stale = append(stale, k)
		}
	})
	return t.ops.Do(func() error {
		for _, k := range stale {
			_ = t.objs.GtRoutes.Delete(k)
		}
		for k, v := range routes {
			if err := t.objs.GtRoutes.Put(k, v); err != nil {
				return fmt.Errorf("writing route %q: %w", string(k.Path[:]), err)
			}
		}
		return nil
	})
}

// AddTarget starts tracing a process (tgid in the initial PID namespace).
func (t *Tracer) AddTarget(pid int, role uint8) error {
	if pid <= 0 || pid >= 65536*64 {
		return fmt.Errorf("pid %d is outside the traceable range 1..%d", pid, 65536*64-1)
	}
	// Keep what the kernel knows (a child added at fork carries a flag that
	// makes its exec of a sandbox CLI recognisable).
	err := t.ops.Do(func() error {
		var cur Target
		if err := t.objs.GtTargets.Lookup(uint32(pid), &cur); err == nil {
			cur.Role = role
		} else {
			cur = Target{Role: role}
		}
		return t.objs.GtTargets.Put(uint32(pid), cur)
	})
	if err != nil {
		return fmt.Errorf("adding target %d: %w", pid, err)
	}
	return t.setBit(pid, true)
}

// RemoveTarget stops tracing a process, unless the kernel follows it on its
// own: a process it saw being born under a target (GT_TARGET_CHILD) stays
// followed, as it was before discovery named it. Discovery lets go of a
// forked child that execs something it does not trace (a launch shell, bash
// -c around a sandbox CLI); dropping it here would hide what that shell
// starts (its server's fork and listen, the CLI's exec). The kernel forgets
// it at its exit.
func (t *Tracer) RemoveTarget(pid int) error {
	if pid <= 0 || pid >= 65536*64 {
		return nil
	}
	var cur Target
	child := false
	_ = t.ops.Do(func() error {
		child = t.objs.GtTargets.Lookup(uint32(pid), &cur) == nil && cur.Flags&uint8(bpfGtTargetFlagGT_TARGET_CHILD) != 0
		return nil
	})
	if child {
		return nil
	}
	if err := t.setBit(pid, false); err != nil {
		return err
	}
	if err := t.ops.Do(func() error { return t.objs.GtTargets.Delete(uint32(pid)) }); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("removing target %d: %w", pid, err)
	}
	t.purgeConns(uint32(pid))
	return nil
}

// ProcessExited forgets the connection state of a process that exited (the
// kernel already stopped tracing it).
func (t *Tracer) ProcessExited(pid int) { t.purgeConns(uint32(pid)) }

// purgeConns drops the connection state of a process. A process killed by a
// signal never calls close(2), so its entries would otherwise wait for LRU
// eviction, taking room from live connections.
func (t *Tracer) purgeConns(tgid uint32) {
	type connKey struct {
		Tgid uint32
		Fd   int32
	}
	var stale []connKey
	walkKeys(t.objs.GtConns, func(k connKey) {
		if k.Tgid == tgid {
			stale = append(stale, k)
		}
	})
	_ = t.ops.Do(func() error {
		for _, k := range stale {
			_ = t.objs.GtConns.Delete(k)
		}
		return nil
	})
}

// walkKeys calls f with each key of m: keys only (BPF_MAP_GET_NEXT_KEY),
// which unlike a lookup does not hold bpf_prog_active (MapOps), so a walk of
// a large map needs no trip to the map thread. A key deleted meanwhile makes
// the walk start over, as the kernel does; it is bounded by the map's size.
func walkKeys[K comparable](m *ebpf.Map, f func(K)) {
	var cur, next K
	seen := 0
	limit := int(m.MaxEntries()) * 2
	for err := m.NextKey(nil, &next); err == nil && seen < limit; err = m.NextKey(cur, &next) {
		f(next)
		cur = next
		seen++
	}
}

func (t *Tracer) setBit(pid int, on bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	word := uint32(pid >> 6)
	return t.ops.Do(func() error {
		var bits uint64
		if err := t.objs.GtTargetBits.Lookup(word, &bits); err != nil {
			return fmt.Errorf("reading target bitmap: %w", err)
		}
		if on {
			bits |= 1 << (pid & 63)
		} else {
			bits &^= 1 << (pid & 63)
		}
		if err := t.objs.GtTargetBits.Put(word, bits); err != nil {
			return fmt.Errorf("writing target bitmap: %w", err)
		}
		return nil
	})
}

// SetPython registers a Python target's interpreter layout (internal/python
// Params, a struct gt_py_params) so the syscall programs can read its asyncio
// context; nil removes it.
func (t *Tracer) SetPython(pid int, params any) error {
	if params == nil {
		if err := t.ops.Do(func() error { return t.objs.GtPyProcs.Delete(uint32(pid)) }); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forgetting Python process %d: %w", pid, err)
		}
		return nil
	}
	if err := t.ops.Do(func() error { return t.objs.GtPyProcs.Put(uint32(pid), params) }); err != nil {
		return fmt.Errorf("registering Python process %d: %w", pid, err)
	}
	return nil
}

// PyCopyProgram is the PyContext_CopyCurrent return probe that links asyncio
// child contexts to their request (attached per process by internal/python).
func (t *Tracer) PyCopyProgram() *ebpf.Program { return t.objs.GtPyCopyRet }

// PyCopySiteProgram is the same link as an entry probe after a call of
// PyContext_CopyCurrent, reading the register its cookie names.
func (t *Tracer) PyCopySiteProgram() *ebpf.Program { return t.objs.GtPyCopySite }

// PyUVWriteProgram is the uvloop UVStream write probe that names the task
// behind a deferred write (attached per process by internal/python).
func (t *Tracer) PyUVWriteProgram() *ebpf.Program { return t.objs.GtPyUvWrite }

// Stats sums the per-CPU counters; index with the Stat* constants.
func (t *Tracer) Stats() ([]uint64, error) {
	out, err := t.perCPUSums(t.objs.GtStats, StatMax)
	if err != nil {
		return nil, fmt.Errorf("reading kernel counters: %w", err)
	}
	return out, nil
}

// perCPUSums reads slots 0..n-1 of a per-CPU array, each summed over the
// CPUs, in one trip to the map thread.
func (t *Tracer) perCPUSums(m *ebpf.Map, n uint32) ([]uint64, error) {
	out := make([]uint64, n)
	err := t.ops.Do(func() error {
		var per []uint64
		for i := uint32(0); i < n; i++ {
			var err error
			if out[i], err = perCPUSum(m, i, &per); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// perCPUSum reads slot i of a per-CPU array summed over the CPUs, into per
// (reused). On the map thread only.
func perCPUSum(m *ebpf.Map, i uint32, per *[]uint64) (uint64, error) {
	if err := m.Lookup(i, per); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range *per {
		sum += v
	}
	return sum, nil
}

// ProfSection is one row of ProfTable: a timed section of the BPF programs.
type ProfSection struct {
	Name  string
	Count uint64  // times the section ran
	NsPer float64 // mean ns per run (bpf_ktime_get_ns, both reads included)
}

var profNames = map[uint32]string{
	uint32(bpfGtProfSectionGT_PROF_IO): "io", uint32(bpfGtProfSectionGT_PROF_CONN): "conn",
	uint32(bpfGtProfSectionGT_PROF_PY_NOTE): "py_note", uint32(bpfGtProfSectionGT_PROF_INJ_NOTE): "inject_note",
	uint32(bpfGtProfSectionGT_PROF_START_REQ): "start_request", uint32(bpfGtProfSectionGT_PROF_ROUTE): "route",
	uint32(bpfGtProfSectionGT_PROF_HEADERS): "headers", uint32(bpfGtProfSectionGT_PROF_SCAN): "scan_headers",
	uint32(bpfGtProfSectionGT_PROF_EMIT): "emit", uint32(bpfGtProfSectionGT_PROF_ROLLOUT): "scan_rollout",
	uint32(bpfGtProfSectionGT_PROF_INJ_ENTER): "inject_enter", uint32(bpfGtProfSectionGT_PROF_INJ_CHECK): "inject_check",
	uint32(bpfGtProfSectionGT_PROF_INJ_DECIDE): "inject_decide", uint32(bpfGtProfSectionGT_PROF_PY_COPY): "py_copy", uint32(bpfGtProfSectionGT_PROF_PY_UVWRITE): "py_uvwrite",
	uint32(bpfGtProfSectionGT_PROF_PROCESS): "process", uint32(bpfGtProfSectionGT_PROF_START_RESP): "start_response",
	uint32(bpfGtProfSectionGT_PROF_PEEK): "peek", uint32(bpfGtProfSectionGT_PROF_REWARD): "scan_reward",
}

// ProfTable reads the section timings gathered with GYMTRACE_PROF_TIME=1
// (bpf/common/util.h); nil when they are off.
func (t *Tracer) ProfTable() []ProfSection {
	if !t.profTime {
		return nil
	}
	var out []ProfSection
	for i := uint32(0); i < uint32(bpfGtProfSectionGT_PROF_MAX); i++ {
		var per []bpfGtProfSlot
		if err := t.ops.Do(func() error { return t.objs.GtProf.Lookup(i, &per) }); err != nil {
			return nil
		}
		var ns, n uint64
		for _, v := range per {
			ns += v.Ns
			n += v.N
		}
		if n == 0 {
			continue
		}
		out = append(out, ProfSection{Name: profNames[i], Count: n, NsPer: float64(ns) / float64(n)})
	}
	return out
}

// Programs returns the loaded programs by name (for bpf_stats in benchmarks).
//
// Where a syscall program has an understudy, the understudy is named in its
// place: the kernel skipping it is what may lose an event (it skipping the
// program itself loses nothing: Understudied).
func (t *Tracer) Programs() map[string]*ebpf.Program {
	m := map[string]*ebpf.Program{}
	for _, tp := range t.tracepoints() {
		m[tp.name] = tp.prog
		if t.understudies() && tp.under != nil {
			m[tp.name] = tp.under
		}
	}
	m["sched_process_fork"] = t.objs.GtFork
	m["sched_process_exec"] = t.objs.GtExec
	m["sched_process_exit"] = t.objs.GtExit
	m["tls_rw_entry"] = t.objs.GtTlsRwEntry
	m["tls_rw_ret"] = t.objs.GtTlsRwRet
	m["tls_handshake"] = t.objs.GtTlsHandshake
	m["tls_free"] = t.objs.GtTlsFree
	return m
}

// FlagInjected marks a client request whose traceparent gymtrace inserted
// (bpf/inject.h): traceparent[] names the request's own CLIENT span.
const FlagInjected = uint16(bpfGtEventFlagGT_F_INJECTED)

// InjectObjects are the programs and maps of bpf/inject.h; internal/inject
// attaches them (inject.Programs has the same fields). Load attaches none.
type InjectObjects struct {
	SockOps, SkMsg                                     *ebpf.Program
	EnterWrite, EnterSendto, EnterWritev, EnterSendmsg *ebpf.Program
	// Understudies: attach each Under* after its Enter* (its slot is
	// filled at Load; bpf/common/understudy.h).
	Understudies                                       bool
	UnderWrite, UnderSendto, UnderWritev, UnderSendmsg *ebpf.Program
	Config, TraceCtxs, Socks, Stats, Procs             *ebpf.Map
}

// Variant is the build of the BPF programs this kernel got (PickVariant).
func (t *Tracer) Variant() Variant { return t.variant }

// InjectUnavailable says why this kernel cannot run traceparent injection's
// programs, or "" when it can.
func (t *Tracer) InjectUnavailable() string { return t.FeatureOff(FeatureInject) }

// FeatureOff says why feature (Feature*) is off on this kernel, or "" when
// the kernel and the build carry it.
func (t *Tracer) FeatureOff(feature string) string {
	for _, u := range t.Off() {
		if u.Feature == feature {
			return "this kernel lacks " + u.Needs
		}
	}
	return ""
}

// Off lists the features off on this kernel, each once: those of the
// programs left out, then those the build leaves out (Variant.Off).
func (t *Tracer) Off() []Unsupported { return offFeatures(t.variant, t.unsupported) }

// Preemption says whether the kernel preempts uprobe programs and what
// gymtrace can do about it here.
func (t *Tracer) Preemption() Preemption { return t.preempt }

// InjectObjects returns the injection programs and maps.
func (t *Tracer) InjectObjects() InjectObjects {
	return InjectObjects{
		SockOps: t.objs.GtInjectSockops, SkMsg: t.objs.GtInjectMsg,
		EnterWrite: t.objs.GtInjectEnterWrite, EnterSendto: t.objs.GtInjectEnterSendto,
		EnterWritev: t.objs.GtInjectEnterWritev, EnterSendmsg: t.objs.GtInjectEnterSendmsg,
		Understudies: t.understudies(),
		UnderWrite:   t.objs.GtUsiWrite, UnderSendto: t.objs.GtUsiSendto,
		UnderWritev: t.objs.GtUsiWritev, UnderSendmsg: t.objs.GtUsiSendmsg,
		Config: t.objs.GtInjectConfig, TraceCtxs: t.objs.GtTraceCtxs,
		Socks: t.objs.GtInjectSocks, Stats: t.objs.GtInjectStats, Procs: t.objs.GtInjectProcs,
	}
}

// TLSPrograms are the OpenSSL uprobe programs of bpf/tls.h. internal/tls
// attaches them per process (tls.Programs has the same fields).
type TLSPrograms struct {
	RWEntry   *ebpf.Program // entry of the read and write functions
	RWReturn  *ebpf.Program // their return
	Handshake *ebpf.Program // SSL_do_handshake entry
	Free      *ebpf.Program // SSL_free entry
}

// TLSPrograms returns the TLS uprobe programs; Load attaches none of them.
func (t *Tracer) TLSPrograms() TLSPrograms {
	return TLSPrograms{
		RWEntry:   t.objs.GtTlsRwEntry,
		RWReturn:  t.objs.GtTlsRwRet,
		Handshake: t.objs.GtTlsHandshake,
		Free:      t.objs.GtTlsFree,
	}
}

// Close detaches every program and frees the maps.
func (t *Tracer) Close() error {
	// At once: each tracepoint's detach waits for the kernel's grace periods.
	errs := []error{probesite.CloseAll(t.links)}
	t.links = nil
	if t.rd != nil {
		t.rdMu.Lock()
		t.rdClosed = true
		errs = append(errs, t.rd.Close())
		t.rdMu.Unlock()
	}
	if t.wakeFile != nil {
		errs = append(errs, t.wakeFile.Close())
	}
	t.ops.Close()
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}
