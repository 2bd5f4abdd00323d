//go:build linux

// Package inject attaches the kernel side of traceparent injection
// (bpf/inject.h) and writes the trace context it reads: which trace an
// outbound call made by an inbound request's handler belongs to.
//
// The kernel parts are three: sys_enter hooks on the write syscalls decide
// the ids, a sock_ops program on the cgroup v2 root puts targets' outbound
// TCP sockets into a sockhash, and an sk_msg program on that sockhash inserts
// the header. Everything is per instance: nothing is pinned, the cgroup
// attachment is a bpf_link of this process, and the sockhash is this
// process's own, so several gymtraces on one host do not see each other's
// state and all of it goes away when the process exits. See
// docs/injection.md.
package inject

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.opentelemetry.io/otel/trace"
)

// Programs are the programs and maps of bpf/inject.h in one loaded object
// (the committed one via internal/loader, or a test object).
type Programs struct {
	SockOps      *ebpf.Program // SEC("sockops") gt_inject_sockops
	SkMsg        *ebpf.Program // SEC("sk_msg") gt_inject_msg
	EnterWrite   *ebpf.Program // sys_enter_write
	EnterSendto  *ebpf.Program // sys_enter_sendto
	EnterWritev  *ebpf.Program // sys_enter_writev
	EnterSendmsg *ebpf.Program // sys_enter_sendmsg
	// Where the kernel runs syscall programs preemptible, each Enter* has
	// an understudy attached after it, for the runs the kernel skips
	// (bpf/common/understudy.h; the loader has given them their programs).
	Understudies                                       bool
	UnderWrite, UnderSendto, UnderWritev, UnderSendmsg *ebpf.Program

	Config    *ebpf.Map // gt_inject_config
	TraceCtxs *ebpf.Map // gt_trace_ctxs
	Socks     *ebpf.Map // gt_inject_socks (sockhash)
	Stats     *ebpf.Map // gt_inject_stats (per-CPU)
	Procs     *ebpf.Map // gt_inject_procs: processes owning a socket in Socks
}

// Options configure Attach.
type Options struct {
	// CgroupPath is the cgroup v2 directory the sock_ops program is attached
	// to; its root (preflight.CgroupV2Path) covers every process.
	CgroupPath string
	// SampleRatio decides the sampled bit of traces the kernel starts (a
	// process that never served makes a call): the same trace-id-ratio rule
	// as the userspace sampler, so both agree on every trace id.
	SampleRatio float64
	Log         *slog.Logger
	// MapDo runs the injector's map operations at run time (loader.MapOps:
	// off the threads a kernel may preempt while one holds bpf_prog_active);
	// nil runs them in place.
	MapDo func(func() error) error
}

// Kernel counters (enum gt_inject_stat in bpf/common/contract.h).
const (
	StatPrepared = iota
	StatPushed
	StatInjected
	StatMiss
	StatHasTraceparent
	StatSplit
	StatUnattributed
	StatRoot
	StatNotPushed
	StatPushFail
	StatSocks
	StatSockFail
	statMax = 16
)

// StatNames name the counters for metrics and logs, by index.
var StatNames = [...]string{
	StatPrepared:       "prepared",
	StatPushed:         "pushed",
	StatInjected:       "injected",
	StatMiss:           "miss",
	StatHasTraceparent: "has_traceparent",
	StatSplit:          "split",
	StatUnattributed:   "unattributed",
	StatRoot:           "root",
	StatNotPushed:      "not_pushed",
	StatPushFail:       "push_fail",
	StatSocks:          "sockets",
	StatSockFail:       "socket_fail",
}

const cfgOn = 1 // GT_INJ_ON

// traceKey and traceCtx mirror struct gt_trace_key and struct gt_trace_ctx.
type traceKey struct {
	Conn, Seq uint64
}

type traceCtx struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   uint8
	_       [7]byte
}

// config mirrors struct gt_inject_config.
type config struct {
	RootBound uint64
	Flags     uint32
	_         uint32
}

// Injector is the attached kernel side. Its methods are safe for concurrent
// use. A nil *Injector is valid and does nothing, so callers need not care
// whether injection is on.
type Injector struct {
	p       Programs
	log     *slog.Logger
	mapDo   func(func() error) error
	links   []link.Link
	skmsg   bool
	pubFail atomic.Uint64

	// Map writes not yet made, applied in batches by Flush. pubs: trace
	// contexts published but not yet in the kernel's map; an exchange that
	// ends before the next Flush (most do, at a high rate) is dropped from
	// here and never costs a syscall. dels: unpublished keys still in the
	// kernel's map (not urgent: the exchange is over).
	mu   sync.Mutex
	pubs map[traceKey]traceCtx
	dels []traceKey
	// flushMu orders whole flushes, so a delete can never overtake the put
	// of the same key made by a flush still running on another goroutine.
	flushMu sync.Mutex
}

// maxPending bounds the deferred puts and the deferred deletes: Publish or
// Unpublish flushes at once when this many of its kind wait.
const maxPending = 256

// Attach attaches the programs and turns injection on.
func Attach(p Programs, o Options) (*Injector, error) {
	if p.SockOps == nil || p.SkMsg == nil || p.Config == nil || p.TraceCtxs == nil || p.Socks == nil {
		return nil, errors.New("the BPF object has no traceparent injection programs (rebuild it with ./scripts/gen-bpf)")
	}
	if o.CgroupPath == "" {
		return nil, errors.New("no cgroup v2 mount to attach the socket program to (mount cgroup2, or run with --inject=false)")
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	in := &Injector{p: p, log: log.With("component", "inject"), mapDo: o.MapDo}
	// The sk_msg program first: a socket is only put in the map once it
	// is there, and a socket added with no verdict program would take the
	// sockmap send path for nothing.
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: p.Socks.FD(), Program: p.SkMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return nil, fmt.Errorf("attaching the sk_msg program to its sockhash: %w", err)
	}
	in.skmsg = true
	for _, tp := range []struct {
		name        string
		prog, under *ebpf.Program
	}{
		{"sys_enter_write", p.EnterWrite, p.UnderWrite}, {"sys_enter_sendto", p.EnterSendto, p.UnderSendto},
		{"sys_enter_writev", p.EnterWritev, p.UnderWritev}, {"sys_enter_sendmsg", p.EnterSendmsg, p.UnderSendmsg},
	} {
		progs := []*ebpf.Program{tp.prog}
		if p.Understudies && tp.under != nil {
			// After its program: the kernel runs them in attach order.
			// Targets may already write here; a mark the program leaves
			// before its understudy is on stays until that thread's next
			// event, and only hides one where the kernel then skips the
			// program again (bpf/common/understudy.h).
			progs = append(progs, tp.under)
		}
		for _, prog := range progs {
			l, err := link.Tracepoint("syscalls", tp.name, prog, nil)
			if err != nil {
				in.Close()
				return nil, fmt.Errorf("attaching tracepoint syscalls/%s: %w", tp.name, err)
			}
			in.links = append(in.links, l)
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: o.CgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: p.SockOps})
	if err != nil {
		in.Close()
		return nil, fmt.Errorf("attaching the sock_ops program to cgroup %s: %w", o.CgroupPath, err)
	}
	in.links = append(in.links, l)
	if err := in.setConfig(o.SampleRatio, true); err != nil {
		in.Close()
		return nil, err
	}
	return in, nil
}

// RootBound is the kernel's sampling threshold for a ratio: a new trace is
// sampled when (big-endian trace_id[8:16] >> 1) < RootBound, which is
// OpenTelemetry's TraceIDRatioBased rule.
func RootBound(ratio float64) uint64 {
	switch {
	case ratio >= 1 || math.IsNaN(ratio):
		return 1 << 63
	case ratio <= 0:
		return 0
	}
	return uint64(ratio * (1 << 63))
}

func (in *Injector) setConfig(ratio float64, on bool) error {
	c := config{RootBound: RootBound(ratio)}
	if on {
		c.Flags = cfgOn
	}
	if err := in.do(func() error { return in.p.Config.Put(uint32(0), &c) }); err != nil {
		return fmt.Errorf("writing the injection config: %w", err)
	}
	return nil
}

// Publish tells the kernel the trace of inbound request (conn, seq): an
// outbound call its handler makes carries traceparent
// 00-<tid>-<new span id>-<sampled>. parent is the span that call's CLIENT
// span hangs under (kept for userspace diagnostics). conn 0 with seq = pid
// names the process's gym.job instead (PublishJob).
//
// A request's context reaches the kernel at the next Flush, which the reader
// runs as soon as it has drained the ring buffer: the records of one drain
// cost one map syscall, not one each. A job's goes at once (jobs are rare and
// must not wait for traffic).
func (in *Injector) Publish(conn, seq uint64, tid trace.TraceID, parent trace.SpanID, sampled bool) {
	if in == nil || !tid.IsValid() {
		return
	}
	v := traceCtx{TraceID: tid, SpanID: parent}
	if sampled {
		v.Flags = 1
	}
	k := traceKey{conn, seq}
	if conn != 0 {
		in.mu.Lock()
		if in.pubs == nil {
			in.pubs = make(map[traceKey]traceCtx)
		}
		in.pubs[k] = v
		full := len(in.pubs) >= maxPending
		in.mu.Unlock()
		if full {
			in.Flush()
		}
		return
	}
	// A job key (0, pid) can come back when a pid is reused: a delete still
	// pending for the old one must not remove the new one.
	in.mu.Lock()
	in.dels = slices.DeleteFunc(in.dels, func(d traceKey) bool { return d == k })
	in.mu.Unlock()
	if err := in.do(func() error { return in.p.TraceCtxs.Put(k, &v) }); err != nil {
		in.publishFailed(err)
	}
}

// do runs a map operation where Options.MapDo says, or in place.
func (in *Injector) do(f func() error) error {
	if in.mapDo == nil {
		return f()
	}
	return in.mapDo(f)
}

// publishFailed reports map write failures. An LRU map only fails on a
// kernel error; the call then simply goes without a header. Say so once in
// a while, not per request.
func (in *Injector) publishFailed(err error) {
	if n := in.pubFail.Add(1); n&(n-1) == 0 {
		in.log.Warn("cannot publish a trace context to the kernel; outbound calls go without traceparent",
			"failures", n, "err", err)
	}
}

// Unpublish forgets (conn, seq): its exchange is over. A context not yet
// flushed is simply dropped; otherwise the delete is deferred to the next
// Flush. The key is never looked up again, since connection ids are not
// reused.
func (in *Injector) Unpublish(conn, seq uint64) {
	if in == nil {
		return
	}
	k := traceKey{conn, seq}
	in.mu.Lock()
	if _, ok := in.pubs[k]; ok {
		delete(in.pubs, k)
		in.mu.Unlock()
		return
	}
	in.dels = append(in.dels, k)
	full := len(in.dels) >= maxPending
	in.mu.Unlock()
	if full {
		in.Flush()
	}
}

// Flush applies the deferred puts, then the deferred deletes, each in one
// batch where the kernel supports it (Linux 5.6+). The reader calls it
// whenever it has drained the ring buffer.
func (in *Injector) Flush() {
	if in == nil {
		return
	}
	in.flushMu.Lock()
	defer in.flushMu.Unlock()
	in.mu.Lock()
	var keys []traceKey
	var vals []traceCtx
	if len(in.pubs) > 0 {
		keys = make([]traceKey, 0, len(in.pubs))
		vals = make([]traceCtx, 0, len(in.pubs))
		for k, v := range in.pubs {
			keys = append(keys, k)
			vals = append(vals, v)
		}
		clear(in.pubs)
	}
	dels := in.dels
	in.dels = nil
	in.mu.Unlock()
	if len(keys) == 0 && len(dels) == 0 {
		return
	}
	_ = in.do(func() error {
		in.putAll(keys, vals)
		in.deleteAll(dels)
		return nil
	})
}

func (in *Injector) putAll(keys []traceKey, vals []traceCtx) {
	if len(keys) == 0 {
		return
	}
	n, err := in.p.TraceCtxs.BatchUpdate(keys, vals, nil)
	if err == nil {
		return
	}
	// No batch operations (Linux < 5.6), or one key failed: the rest one at
	// a time.
	for i := n; i < len(keys); i++ {
		if err := in.p.TraceCtxs.Put(keys[i], &vals[i]); err != nil {
			in.publishFailed(err)
		}
	}
}

func (in *Injector) deleteAll(keys []traceKey) {
	for len(keys) > 0 {
		n, err := in.p.TraceCtxs.BatchDelete(keys, nil)
		switch {
		case err == nil:
			return
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// LRU-evicted, or published by the kernel itself: skip it.
			keys = keys[min(n+1, len(keys)):]
		default:
			// No batch operations (Linux < 5.6): one at a time.
			for _, k := range keys[n:] {
				_ = in.p.TraceCtxs.Delete(k) // LRU: a missing key is fine
			}
			return
		}
	}
}

// PublishJob publishes a process's gym.job: its calls no inbound request
// caused join that trace.
func (in *Injector) PublishJob(pid uint32, tid trace.TraceID, job trace.SpanID, sampled bool) {
	in.Publish(0, uint64(pid), tid, job, sampled)
}

// UnpublishJob forgets a process's gym.job.
func (in *Injector) UnpublishJob(pid uint32) { in.Unpublish(0, uint64(pid)) }

// Stats sums the kernel counters; index with the Stat* constants.
func (in *Injector) Stats() ([]uint64, error) {
	out := make([]uint64, statMax)
	if in == nil || in.p.Stats == nil {
		return out, nil
	}
	err := in.do(func() error {
		var per []uint64
		for i := uint32(0); i < statMax; i++ {
			if err := in.p.Stats.Lookup(i, &per); err != nil {
				return fmt.Errorf("reading injection counters: %w", err)
			}
			for _, v := range per {
				out[i] += v
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Close turns injection off and detaches everything. Sockets already in the
// sockhash keep passing through the (now idle) sk_msg program until the map
// is freed with the object.
func (in *Injector) Close() error {
	if in == nil {
		return nil
	}
	var errs []error
	if in.p.Config != nil {
		errs = append(errs, in.setConfig(0, false))
	}
	for i := len(in.links) - 1; i >= 0; i-- {
		errs = append(errs, in.links[i].Close())
	}
	in.links = nil
	if in.skmsg {
		errs = append(errs, link.RawDetachProgram(link.RawDetachProgramOptions{
			Target: in.p.Socks.FD(), Program: in.p.SkMsg, Attach: ebpf.AttachSkMsgVerdict,
		}))
		in.skmsg = false
	}
	return errors.Join(errs...)
}
