//go:build linux

package spans

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Clock converts kernel timestamps; *http.Clock implements it.
type Clock interface {
	Wall(mono uint64) time.Time
	NowMono() uint64
}

// Options configure a Builder.
type Options struct {
	// Mask is the initial set of enabled span groups; SetMask changes it.
	Mask groups.Mask
	// Lookup returns what discovery knows about a traced process (role,
	// server name), or nil. Called once per request, from the Builder's lock.
	Lookup func(pid int) *discover.Process
	// IDs decides trace and span ids (NewRandomIDs when nil).
	IDs IDGenerator
	// Clock converts kernel timestamps to wall time (a new http.Clock when nil).
	Clock Clock
	// Sampler decides, for each new trace or remote parent, whether its spans
	// are exported: typically sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)).
	// Spans under a local parent follow the parent. Nil samples everything.
	Sampler sdktrace.Sampler
	Logger  *slog.Logger
	// Inject, when set, receives the trace context of every inbound request
	// that has an enclosing span, and of every gym.job, so the kernel can
	// write traceparent into the outbound calls they make
	// (internal/inject.Injector; docs/injection.md).
	Inject Injector
}

// Injector is the kernel side of traceparent injection as the Builder sees
// it. (conn, seq) name a server request; the CLIENT span of a call its
// handler makes hangs under parent, in trace tid.
type Injector interface {
	Publish(conn, seq uint64, tid trace.TraceID, parent trace.SpanID, sampled bool)
	Unpublish(conn, seq uint64)
	PublishJob(pid uint32, tid trace.TraceID, job trace.SpanID, sampled bool)
	UnpublishJob(pid uint32)
}

// Stats are the Builder's counters, for metrics. Totals since creation, except
// the Open* gauges.
type Stats struct {
	Spans                [groups.Count]uint64 // spans returned, per group bit
	Unsampled            uint64               // spans built but not returned: their trace was not sampled
	Truncated            uint64               // spans ended by gymtrace (shutdown, eviction): nemo.span.truncated
	ParentByContext      uint64               // client requests attributed by asyncio context (sandbox CLIs count in these four too)
	ParentByNesting      uint64               // client requests attributed as the innermost of one chain of in-flight requests
	ParentNone           uint64               // client requests with no inbound request in flight: roots
	ParentAmbiguous      uint64               // client requests with several candidate inbound requests: roots marked unresolved
	ParentNoContext      uint64               // ... of which the process's asyncio context cannot be read (an unrecognised uvloop build)
	JoinedTuple          uint64               // server spans joined to a client span on this node by connection
	LateJoins            uint64               // ... of which the client's record arrived after the server's
	JoinedTraceparent    uint64               // server or gym.* spans joined to an in-band traceparent
	OwnTraceparent       uint64               // client requests that already carried a traceparent (the process's own telemetry)
	Injected             uint64               // client requests whose traceparent gymtrace inserted: the CLIENT span has its id
	InjectAdopted        uint64               // ... that started a trace: the kernel's trace id was taken
	InjectMismatch       uint64               // ... whose inserted trace was not the parent's: the span follows the wire (own trace)
	Retraced             uint64               // published server requests whose trace changed after publishing (late connection join)
	KernelTraceDisagreed uint64               // kernel-started traces whose sampled bit the sampler did not confirm (published again)
	BadTraceparent       uint64               // traceparent headers that failed validation (ignored)
	GymSpanUnresolved    uint64               // gym.* spans not made: the process's role is unknown and the route is shared
	RoleInferred         uint64               // processes whose role was inferred from their traffic (roles.go)
	Held                 uint64               // spans held until their process's role was decided
	RoleUndecided        uint64               // server and gym.* spans named by route shape alone: the role was not decided within the hold bound
	UnknownSide          uint64
	OpenServer           int // inbound exchanges in flight
	OpenClient           int // outbound exchanges in flight
	JoinQueue            int // client requests waiting for a server on this node (or their own response)
	OpenJobs             int // gym.job spans begun, their collector still running
	OpenSandboxes        int // gym.sandbox.* spans begun, their CLI still running
}

// node is one span that exists (its group was enabled at request time), from
// its request to its end. Trace ids and the sampling decision live on the root
// of the parent chain and are resolved when a span is returned, so a server
// span whose client record arrives late can still be re-parented.
type node struct {
	id      trace.SpanID
	parent  *node        // local parent span, nil for a root
	remote  trace.SpanID // parent span from a traceparent, when parent == nil
	traceID trace.TraceID
	sampled bool
	frozen  bool // root only: a span of this trace was returned; no more re-parenting
	// root only: the trace id was handed to the kernel for injection, so
	// it may be on the wire; it is never replaced by another one.
	published bool
	// alias: a provisional gym.* span its process's role decided away; it
	// is not returned, and its children hang under its parent.
	alias bool
}

func (n *node) root() *node {
	for n.parent != nil {
		n = n.parent
	}
	return n
}

func (n *node) parentID() trace.SpanID {
	p := n.parent
	if p == nil {
		return n.remote
	}
	for depth := 0; p.alias && depth < 8; depth++ {
		if p.parent == nil {
			return p.remote
		}
		p = p.parent
	}
	return p.id
}

// inbound is a request a traced process is serving.
type inbound struct {
	x        *http.Exchange
	proc     *discover.Process
	ri       routeInfo
	server   *node       // SERVER span, nil when the server group is off
	gym      *node       // gym.* span, nil when none or its group is off
	gymProv  bool        // gym is provisional: the process's role decides its name (roles.go)
	gymCands groups.Mask // ... among these groups
	via      *outbound   // the client request on this node that sent it
	rollout  string
	idx      int // position in Builder.inflight[pid]
	waiting  bool
	hasTP    bool
	tp       trace.SpanContext // the request's own traceparent, when hasTP
	pub      bool              // its trace context is published for injection
	ctxKeys  []ctxKey
	mark     uint64
	shadowed uint64
}

// outbound is a request a traced process is making.
type outbound struct {
	x          *http.Exchange
	proc       *discover.Process
	client     *node    // CLIENT span, nil when http_client is off
	via        *inbound // the inbound request whose handler made it
	rollout    string
	unresolved string
	queued     bool
}

// tupleKey names a TCP connection from the client's side: a client's
// (local, remote) equals the server's (remote, local).
type tupleKey struct{ client, server netip.AddrPort }

// joinQueue holds, for one connection, the client requests whose server has
// not been seen yet and the server requests whose client has not been seen
// yet (the ring buffer normally delivers the client's record first).
type joinQueue struct {
	clients []*outbound
	servers []*inbound
}

type ctxKey struct {
	pid uint32
	ctx uint64
}

// Builder turns assembled exchanges into Gym's spans. It implements
// http.Handler; finished spans accumulate until Take. Safe for concurrent
// use: a mutex serialises the reader loop, BindContext and Flush; SetMask is
// lock-free.
type Builder struct {
	mu       sync.Mutex
	mask     atomic.Uint64
	opt      Options
	log      *slog.Logger
	inflight map[uint32][]*inbound
	tuples   map[tupleKey]*joinQueue
	ctx      map[ctxKey]*inbound // nil value: key bound to several requests
	inferred map[uint32]groups.Role
	procs    map[uint32]*discover.Process
	open     map[*http.Exchange]struct{}
	out      []Span
	epoch    uint64
	st       Stats
	lc       lifecycle // gym.job and gym.sandbox.* (lifecycle.go)
	jobIDs   map[uint32]jobIDs
	noCtx    map[uint32]string // pid -> why its calls cannot name their request (SetNoContext)
	counts   map[uint32]*ReqCounts
	// Roles by behaviour (roles.go).
	held      map[uint32]*holdQueue
	gaveUp    map[uint32]bool
	roleProcs map[uint32]*roleProc
	injected  map[trace.SpanID]*outbound // open CLIENT spans whose id is on the wire
}

// ReqCounts are the HTTP requests a process served and made since it was
// first seen (Counts).
type ReqCounts struct{ Served, Made uint64 }

// jobIDs are a collector's gym.job ids, decided and published before its
// first call (PrepareJob) so that even its first calls carry the job's trace.
type jobIDs struct {
	trace   trace.TraceID
	span    trace.SpanID
	sampled bool
}

// NewBuilder returns a Builder; it fails only when the clock or the id
// generator cannot be initialised.
func NewBuilder(opt Options) (*Builder, error) {
	if opt.Clock == nil {
		c, err := http.NewClock()
		if err != nil {
			return nil, err
		}
		opt.Clock = c
	}
	if opt.IDs == nil {
		ids, err := NewRandomIDs()
		if err != nil {
			return nil, err
		}
		opt.IDs = ids
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	b := &Builder{
		opt:      opt,
		log:      opt.Logger.With("component", "spans"),
		inflight: make(map[uint32][]*inbound),
		tuples:   make(map[tupleKey]*joinQueue),
		ctx:      make(map[ctxKey]*inbound),
		inferred: make(map[uint32]groups.Role),
		procs:    make(map[uint32]*discover.Process),
		open:     make(map[*http.Exchange]struct{}),
		jobIDs:   make(map[uint32]jobIDs),
		noCtx:    make(map[uint32]string),
		counts:   make(map[uint32]*ReqCounts),
	}
	b.mask.Store(uint64(opt.Mask))
	return b, nil
}

// SetMask changes the enabled groups (SIGHUP). Exchanges already started keep
// the spans decided at their request.
func (b *Builder) SetMask(m groups.Mask) { b.mask.Store(uint64(m)) }

// Mask returns the enabled groups.
func (b *Builder) Mask() groups.Mask { return groups.Mask(b.mask.Load()) }

// Take returns the spans finished since the last call; the caller owns them.
func (b *Builder) Take() []Span {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expireHolds()
	out := b.out
	b.out = nil
	return out
}

// Stats returns the counters.
func (b *Builder) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.st
	s.OpenServer, s.OpenClient = 0, 0
	for x := range b.open {
		if x.IsServer() {
			s.OpenServer++
		} else {
			s.OpenClient++
		}
	}
	for _, q := range b.tuples {
		s.JoinQueue += len(q.clients)
	}
	s.OpenJobs, s.OpenSandboxes = len(b.lc.jobs), len(b.lc.sandboxes)
	return s
}

// InferredRole is the role the Builder inferred for a process from the routes
// it serves (RoleUnknown when none), for resource attributes.
func (b *Builder) InferredRole(pid int) groups.Role {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inferred[uint32(pid)]
}

// ForgetProcess drops per-process state after the process exits.
func (b *Builder) ForgetProcess(pid int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Spans still waiting for its role are named by route shape.
	b.release(uint32(pid), groups.RoleUnknown)
	delete(b.gaveUp, uint32(pid))
	delete(b.roleProcs, uint32(pid))
	delete(b.inferred, uint32(pid))
	delete(b.procs, uint32(pid))
	delete(b.jobIDs, uint32(pid))
	delete(b.noCtx, uint32(pid))
	delete(b.counts, uint32(pid))
	if b.opt.Inject != nil {
		b.opt.Inject.UnpublishJob(uint32(pid))
	}
}

// SetNoContext records that process pid's calls cannot name their inbound
// request through the asyncio context, and why (e.g. "uvloop_unrecognized":
// its uvloop defers writes and gymtrace could not probe that build). A call
// of that process left without a parent carries the reason in
// gymtrace.parent.unresolved instead of "ambiguous".
func (b *Builder) SetNoContext(pid int, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.noCtx[uint32(pid)] = why
}

// PrepareJob decides the gym.job ids of a collector (a process whose calls
// belong to its run) before it makes any call, and publishes them for
// injection, so its first calls already carry the job's trace. The job span
// itself starts, as before, at its first /run call. No-op without injection
// or with the job group off.
func (b *Builder) PrepareJob(pid int) {
	if b.opt.Inject == nil || !b.Mask().Has(groups.Job) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lc.init()
	if _, ok := b.jobIDs[uint32(pid)]; ok || b.lc.jobs[uint32(pid)] != nil {
		return
	}
	ids := jobIDs{trace: b.opt.IDs.NewTraceID(), span: b.opt.IDs.NewSpanID()}
	ids.sampled = b.sample(context.Background(), ids.trace)
	b.jobIDs[uint32(pid)] = ids
	b.opt.Inject.PublishJob(uint32(pid), ids.trace, ids.span, ids.sampled)
}

// bindJob gives a gym.job made by jobParent the ids PrepareJob published,
// or publishes its own.
func (b *Builder) bindJob(pid uint32, j *node) {
	if b.opt.Inject == nil || j.parent != nil || j.published {
		return
	}
	if ids, ok := b.jobIDs[pid]; ok && !j.frozen {
		j.id, j.traceID, j.sampled = ids.span, ids.trace, ids.sampled
		delete(b.jobIDs, pid)
	}
	j.published = true
	b.opt.Inject.PublishJob(pid, j.traceID, j.id, j.sampled)
}

// publish hands the kernel the trace of inbound request in: the innermost
// span a call made by its handler hangs under.
func (b *Builder) publish(in *inbound) {
	if b.opt.Inject == nil {
		return
	}
	n := in.gym
	if n == nil || n.alias {
		n = in.server
	}
	if n == nil {
		return
	}
	r := n.root()
	r.published = true
	in.pub = true // its entry is deleted when the exchange ends
	if (in.server != nil && r == in.server && in.hasTP && kernelPublished(in, r)) ||
		(r.traceID == trace.TraceID(in.x.KernelTrace) && r.sampled == in.x.KernelSampled) {
		// The kernel published this very trace itself, when it parsed the
		// request's traceparent (gt_inject_inbound) or when it started the
		// trace (gt_inject_root): a map syscall per request saved.
		return
	}
	b.opt.Inject.Publish(in.x.ConnID, in.x.Seq, r.traceID, n.id, r.sampled)
}

// kernelPublished reports whether the kernel's own publication of an
// inbound request's trace (a version-00 traceparent, the server group on;
// gt_inject_inbound) matches what userspace decided for root r.
func kernelPublished(in *inbound, r *node) bool {
	return strings.HasPrefix(in.x.Traceparent, "00-") && in.tp.TraceID() == r.traceID &&
		in.tp.SpanID() == r.remote && in.tp.IsSampled() == r.sampled
}

// BindContext records that the asyncio Context ctx of process pid runs on
// behalf of an inbound request, so an outbound request whose PyCtx or
// PyRoot is ctx gets that request's span as its parent. The request is
// either the newest in-flight inbound request on server connection connID
// (the handler task created right after the request was read), or, with
// connID 0, the request parentCtx is bound to (a child task whose Context was
// copied from parentCtx). Keys are opaque: the kernel must make them unique
// over time (a Context pointer combined with a generation), because CPython
// recycles Context objects. A key bound to two live requests is treated as
// unknown. Reports whether a binding was made.
func (b *Builder) BindContext(pid uint32, ctx, parentCtx, connID uint64) bool {
	if ctx == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var in *inbound
	if connID != 0 {
		for _, c := range b.inflight[pid] {
			if c.x.ConnID == connID && (in == nil || c.x.ReqStart >= in.x.ReqStart) {
				in = c
			}
		}
	} else if parentCtx != 0 {
		in = b.ctx[ctxKey{pid, parentCtx}]
	}
	if in == nil {
		return false
	}
	k := ctxKey{pid, ctx}
	if old, ok := b.ctx[k]; ok && old != in {
		b.ctx[k] = nil
	} else {
		b.ctx[k] = in
	}
	in.ctxKeys = append(in.ctxKeys, k)
	return true
}

// Counts returns the requests process pid served and made so far.
func (b *Builder) Counts(pid int) ReqCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.counts[uint32(pid)]; c != nil {
		return *c
	}
	return ReqCounts{}
}

// RequestStarted implements http.Handler: ids and parents are decided here.
func (b *Builder) RequestStarted(x *http.Exchange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.counts[x.PID]
	if c == nil {
		c = &ReqCounts{}
		b.counts[x.PID] = c
	}
	if x.Side == loader.SideServer {
		c.Served++
	} else {
		c.Made++
	}
	switch x.Side {
	case loader.SideServer:
		b.startServer(x)
	case loader.SideClient:
		b.startClient(x)
	default:
		b.st.UnknownSide++
	}
}

// ExchangeDone implements http.Handler: the exchange's spans are finished.
func (b *Builder) ExchangeDone(x *http.Exchange) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.finish(x)
}

// Flush ends every exchange, gym.job and sandbox CLI still open now, with
// nemo.span.truncated=true, and returns them with any spans not yet taken.
// For shutdown.
func (b *Builder) Flush() []Span {
	b.mu.Lock()
	now := b.opt.Clock.NowMono()
	for x := range b.open {
		x.Err = http.ErrShutdown
		x.RespStart, x.RespEnd = now, now
		b.finish(x)
	}
	b.flushLifecycle(now)
	for pid := range b.held {
		b.release(pid, groups.RoleUnknown)
	}
	b.mu.Unlock()
	return b.Take()
}

func (b *Builder) process(pid uint32) *discover.Process {
	if b.opt.Lookup != nil {
		if p := b.opt.Lookup(int(pid)); p != nil {
			return p
		}
	}
	p := b.procs[pid]
	if p == nil {
		p = &discover.Process{PID: int(pid), NSPID: int(pid)}
		b.procs[pid] = p
	}
	return p
}

// role is the process's Gym server type: discovery's when known, else what the
// kernel knew, else what its traffic showed.
func (b *Builder) role(p *discover.Process, x *http.Exchange) groups.Role {
	if p.Role != loader.RoleUnknown {
		return groups.Role(p.Role)
	}
	if x.Role != loader.RoleUnknown {
		return groups.Role(x.Role)
	}
	return b.inferred[x.PID]
}

func (b *Builder) startServer(x *http.Exchange) {
	mask := b.Mask()
	in := &inbound{x: x, proc: b.process(x.PID)}
	if b.role(in.proc, x) == groups.RoleUnknown {
		if r := inferRole(x.Method, x.Path); r != groups.RoleUnknown {
			b.decideRole(x.PID, in.proc, r, "serves "+x.Path)
		}
	}
	tp, tpOK := b.traceparent(x)
	in.hasTP, in.tp = tpOK, tp

	// The connection join is kept even when no span uses it: rollout ids and
	// nesting follow it.
	b.joinServer(tupleKey{client: x.Remote, server: x.Local}, in)
	b.inferFromCaller(in)
	in.ri = classify(b.role(in.proc, x), x.Method, x.Path)
	provisional := b.provisionalGym(in, mask)
	if in.ri.ambiguous&mask != 0 && !provisional {
		b.st.GymSpanUnresolved++
	}

	if mask.Has(groups.Server) {
		in.server = b.newNode()
		switch {
		case tpOK:
			b.setRemote(in.server, tp)
			b.st.JoinedTraceparent++
		case in.via != nil && in.via.client != nil:
			in.server.parent = in.via.client
			b.st.JoinedTuple++
		default:
			b.setRequestRoot(in.server, x)
		}
	}
	if provisional || in.ri.gymSpan != "" && mask.Has(in.ri.gymGroup) {
		in.gym = b.newNode()
		switch {
		case in.server != nil:
			in.gym.parent = in.server
		case tpOK:
			// With server off the gym.* span takes its place: a root unless
			// the request itself carries the trace.
			b.setRemote(in.gym, tp)
			b.st.JoinedTraceparent++
		default:
			b.setRequestRoot(in.gym, x)
		}
	}
	in.rollout = in.ri.rolloutID
	if in.rollout == "" {
		in.rollout = x.Rollout.GymID()
	}
	if in.rollout == "" && in.via != nil {
		in.rollout = in.via.rollout
	}
	list := b.inflight[x.PID]
	in.idx = len(list)
	b.inflight[x.PID] = append(list, in)
	b.open[x] = struct{}{}
	x.Handle = in
	b.publish(in)
}

func (b *Builder) startClient(x *http.Exchange) {
	mask := b.Mask()
	out := &outbound{x: x, proc: b.process(x.PID)}
	tp, ownTP := b.traceparent(x)
	// A header gymtrace inserted is not the process's own telemetry: it
	// names this CLIENT span itself.
	injected := ownTP && x.ReqFlags&loader.FlagInjected != 0
	if injected {
		ownTP = false
	}
	out.via = b.cause(x, &out.unresolved)
	if _, id := groups.StripRolloutPrefix(x.Path); id != "" {
		out.rollout = id
	} else if out.via != nil {
		out.rollout = out.via.rollout
	}
	// A collector's calls belong to its run, not to a request it happens to
	// be serving (gym eval run serves the head server in-process).
	b.inferFromCall(x, out.proc)
	job := b.jobParent(x, out.proc, mask)
	if job != nil {
		b.bindJob(x.PID, job)
	}
	if mask.Has(groups.HTTPClient) {
		n := b.newNode()
		if injected {
			n.id = tp.SpanID()
		}
		switch {
		case ownTP:
			// The process's own telemetry wrote this header: join its trace
			// rather than add a second client layer.
			b.setRemote(n, tp)
			b.st.OwnTraceparent++
			out.unresolved = ""
		case job != nil:
			n.parent = job
			out.unresolved = ""
		case out.via != nil && out.via.gym != nil:
			n.parent = out.via.gym
		case out.via != nil && out.via.server != nil:
			n.parent = out.via.server
		default:
			// No enabled span encloses the call: Gym's context would be empty.
			b.setRoot(n)
		}
		if injected {
			b.adoptInjected(n, tp, out)
			b.noteInjected(n.id, out)
		}
		out.client = n
	}
	b.joinClient(tupleKey{client: x.Local, server: x.Remote}, out)
	b.open[x] = struct{}{}
	x.Handle = out
}

// adoptInjected reconciles CLIENT span n, whose id the kernel already put on
// the wire in sc, with the trace its parent chain is in. The wire wins: the
// next hop's spans hang under sc, so n must be in sc's trace.
func (b *Builder) adoptInjected(n *node, sc trace.SpanContext, out *outbound) {
	b.st.Injected++
	r := n.root()
	if r.traceID == sc.TraceID() {
		return
	}
	if r.parent == nil && !r.remote.IsValid() && !r.published && !r.frozen {
		// A trace nobody has seen yet (this call starts it: the kernel
		// decided a new trace id and its sampled bit): take the kernel's.
		r.traceID, r.sampled = sc.TraceID(), sc.IsSampled()
		b.st.InjectAdopted++
		return
	}
	// The parent's trace changed after the kernel read it (a late
	// connection join), or the kernel's cause and the Builder's disagree.
	// Keep the wire's trace so the hops after this one stay joined to it.
	b.st.InjectMismatch++
	n.parent = nil
	n.traceID, n.remote = sc.TraceID(), trace.SpanID{}
	n.sampled = sc.IsSampled()
	out.unresolved = "injected_trace_mismatch"
}

// cause picks the inbound request whose handler made outbound request x.
// Never a guess between unrelated requests: with several candidates that do
// not form one chain, it returns nil and sets *why.
func (b *Builder) cause(x *http.Exchange, why *string) *inbound {
	// The kernel bound the call to its inbound request through the asyncio
	// context (bpf/python.h): exact, whatever else is in flight.
	if x.CauseConn != 0 {
		for _, in := range b.inflight[x.PID] {
			if in.x.ConnID == x.CauseConn && in.x.Seq == x.CauseSeq {
				b.st.ParentByContext++
				return in
			}
		}
		// Its request is not traced (gated off, or before attach): the call
		// has no parent here, as in Gym when that request has no span.
		b.st.ParentNone++
		*why = "request_not_traced"
		return nil
	}
	for _, k := range [2]uint64{x.PyCtx, x.PyRoot} {
		if k == 0 {
			continue
		}
		if in, ok := b.ctx[ctxKey{x.PID, k}]; ok && in != nil {
			b.st.ParentByContext++
			return in
		}
	}
	var only *inbound
	n := 0
	b.epoch++
	for _, in := range b.inflight[x.PID] {
		if in.x.ReqStart <= x.ReqStart {
			in.mark = b.epoch
			only = in
			n++
		}
	}
	switch n {
	case 0:
		b.st.ParentNone++
		return nil
	case 1:
		return only
	}
	// Several in flight. If they are nested (the agent's /run awaiting its own
	// /v1/responses, which makes the call), every one but the innermost is an
	// ancestor of another: its handler is blocked on that descendant.
	for _, in := range b.inflight[x.PID] {
		if in.mark != b.epoch {
			continue
		}
		o := in.via
		for depth := 0; o != nil && o.via != nil && depth < 32; depth++ {
			if p := o.via; p.mark == b.epoch {
				p.shadowed = b.epoch
			}
			o = o.via.via
		}
	}
	n = 0
	for _, in := range b.inflight[x.PID] {
		if in.mark == b.epoch && in.shadowed != b.epoch {
			only = in
			n++
		}
	}
	if n == 1 {
		b.st.ParentByNesting++
		return only
	}
	b.st.ParentAmbiguous++
	*why = "ambiguous"
	if r, ok := b.noCtx[x.PID]; ok {
		b.st.ParentNoContext++
		*why = r
	}
	return nil
}

// joinSlack absorbs the order in which the two ends' syscalls return: both
// timestamps are taken at syscall exit, so the reader's read can return
// before the writer's write does: by tens of microseconds usually, by
// milliseconds when the woken reader preempts the writer on a busy machine.
// The timing test is only a guard for connections picked up mid-stream
// (inOrder).
const joinSlack = uint64(2 * time.Millisecond)

// inOrder reports whether client request c and server request s come from a
// connection the kernel followed from its first byte on both ends
// (loader.FlagFresh): then each end's k-th request is the other's k-th, in
// the queue's order, and no timestamp can contradict that. (HTTP/1.1 clients
// write request k+1 after reading response k, and both ends' exchange k has
// left the queue by then, so a lost record does not shift the pairing.)
func inOrder(c, s *http.Exchange) bool {
	return c.ReqFlags&s.ReqFlags&loader.FlagFresh != 0
}

func (b *Builder) joinServer(k tupleKey, in *inbound) {
	q := b.tuples[k]
	if q != nil {
		for len(q.clients) > 0 {
			c := q.clients[0]
			// A client that started writing after this request was fully
			// read cannot have sent it: leave it for the next request.
			if c.x.ReqStart > in.x.ReqEnd+joinSlack && !inOrder(c.x, in.x) {
				break
			}
			q.clients[0] = nil
			q.clients = q.clients[1:]
			c.queued = false
			in.via = c
			b.dropEmpty(k, q)
			return
		}
	} else {
		q = &joinQueue{}
		b.tuples[k] = q
	}
	in.waiting = true
	q.servers = append(q.servers, in)
}

func (b *Builder) joinClient(k tupleKey, out *outbound) {
	q := b.tuples[k]
	if q != nil {
		for len(q.servers) > 0 {
			s := q.servers[0]
			q.servers[0] = nil
			q.servers = q.servers[1:]
			s.waiting = false
			// A server request fully read before this client began writing
			// was sent by an earlier, unseen client request.
			if s.x.ReqEnd+joinSlack < out.x.ReqStart && !inOrder(out.x, s.x) {
				continue
			}
			b.lateJoin(s, out)
			b.dropEmpty(k, q)
			return
		}
	} else {
		q = &joinQueue{}
		b.tuples[k] = q
	}
	out.queued = true
	q.clients = append(q.clients, out)
}

// lateJoin links a server request to the client request that sent it when the
// client's record came second (the two sides' records raced across CPUs).
func (b *Builder) lateJoin(s *inbound, out *outbound) {
	s.via = out
	if s.rollout == "" {
		s.rollout = out.rollout
	}
	b.inferFromCaller(s)
	if s.server == nil || s.hasTP || out.client == nil || s.server.parent != nil || s.server.frozen {
		return
	}
	s.server.parent = out.client
	b.st.JoinedTuple++
	b.st.LateJoins++
	if s.pub {
		// Its calls must carry the trace it now belongs to. A call made
		// before this (unlikely: the join comes microseconds after the
		// request, a handler's first call milliseconds) keeps the old one.
		b.st.Retraced++
		b.publish(s)
	}
}

func (b *Builder) dropEmpty(k tupleKey, q *joinQueue) {
	if len(q.clients) == 0 && len(q.servers) == 0 {
		delete(b.tuples, k)
	}
}

func removeFrom[T comparable](s []T, v T) []T {
	for i, e := range s {
		if e == v {
			copy(s[i:], s[i+1:])
			var zero T
			s[len(s)-1] = zero
			return s[:len(s)-1]
		}
	}
	return s
}

func (b *Builder) traceparent(x *http.Exchange) (trace.SpanContext, bool) {
	if x.Traceparent == "" {
		return trace.SpanContext{}, false
	}
	sc, ok := ParseTraceparent(x.Traceparent)
	if !ok {
		b.st.BadTraceparent++
		b.log.Debug("ignoring a traceparent header that is not valid W3C trace context",
			"pid", x.PID, "path", x.Path, "traceparent", x.Traceparent)
	}
	return sc, ok
}

func (b *Builder) newNode() *node { return &node{id: b.opt.IDs.NewSpanID()} }

func (b *Builder) setRoot(n *node) {
	n.traceID = b.opt.IDs.NewTraceID()
	n.sampled = b.sample(context.Background(), n.traceID)
}

// setRequestRoot makes n the root of a new trace for inbound request x: the
// trace the kernel started and published for x's handler's calls when there
// is one (bpf/inject.h, gt_inject_root), so those calls already carry it.
func (b *Builder) setRequestRoot(n *node, x *http.Exchange) {
	tid := trace.TraceID(x.KernelTrace)
	if !tid.IsValid() {
		b.setRoot(n)
		return
	}
	n.traceID = tid
	n.sampled = b.sample(context.Background(), tid)
	if n.sampled != x.KernelSampled {
		b.st.KernelTraceDisagreed++
	}
}

func (b *Builder) setRemote(n *node, sc trace.SpanContext) {
	n.traceID, n.remote = sc.TraceID(), sc.SpanID()
	if b.opt.Sampler == nil {
		n.sampled = sc.IsSampled()
		return
	}
	n.sampled = b.sample(trace.ContextWithRemoteSpanContext(context.Background(), sc), n.traceID)
}

func (b *Builder) sample(parent context.Context, tid trace.TraceID) bool {
	if b.opt.Sampler == nil {
		return true
	}
	res := b.opt.Sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: parent, TraceID: tid})
	return res.Decision == sdktrace.RecordAndSample
}

func (b *Builder) finish(x *http.Exchange) {
	delete(b.open, x)
	switch h := x.Handle.(type) {
	case *inbound:
		b.finishServer(h)
	case *outbound:
		b.finishClient(h)
	}
	x.Handle = nil
}

func (b *Builder) finishServer(in *inbound) {
	x := in.x
	if in.pub {
		b.opt.Inject.Unpublish(x.ConnID, x.Seq)
	}
	list := b.inflight[x.PID]
	if in.idx < len(list) && list[in.idx] == in {
		last := len(list) - 1
		list[in.idx] = list[last]
		list[in.idx].idx = in.idx
		list[last] = nil
		list = list[:last]
	}
	if len(list) == 0 {
		delete(b.inflight, x.PID)
	} else {
		b.inflight[x.PID] = list
	}
	if in.waiting {
		k := tupleKey{client: x.Remote, server: x.Local}
		if q := b.tuples[k]; q != nil {
			q.servers = removeFrom(q.servers, in)
			b.dropEmpty(k, q)
		}
	}
	for _, k := range in.ctxKeys {
		if cur, ok := b.ctx[k]; ok && (cur == in || cur == nil) {
			delete(b.ctx, k)
		}
	}
	status, msg, errType := serverStatus(x)
	// While the process's role is undecided its spans are held, and named
	// again when it is (roles.go).
	var rc *reclass
	if b.undecided(in.proc, x.Role) {
		rc = &reclass{method: x.Method, path: x.Path, cands: in.gymCands}
	}
	if in.server != nil {
		name := serverSpanName(x.Method, in.ri.route)
		attrs := make([]attribute.KeyValue, 0, 14)
		attrs = append(attrs,
			attribute.String("http.request.method", x.Method),
			attribute.String("url.path", x.Path),
			attribute.String("url.scheme", scheme(x)),
			attribute.String("http.route", in.ri.route),
		)
		if x.Status > 0 {
			attrs = append(attrs, attribute.Int("http.response.status_code", x.Status))
		}
		attrs = appendAddr(attrs, "server", x.Local)
		attrs = appendAddr(attrs, "client", x.Remote)
		attrs = b.appendGym(attrs, in.proc, in.rollout)
		if errType != "" {
			attrs = append(attrs, attribute.String("error.type", errType))
		}
		b.emit(in.server, name, trace.SpanKindServer, groups.Server, x, attrs, status, msg, in.proc, rc, nil)
	}
	if in.gym != nil && !in.gym.alias {
		attrs := b.appendGym(make([]attribute.KeyValue, 0, 3), in.proc, in.rollout)
		var gymRC *reclass
		if in.gymProv {
			gymRC = rc
		}
		b.emit(in.gym, in.ri.gymSpan, trace.SpanKindInternal, in.ri.gymGroup, x, attrs, status, msg, in.proc, nil, gymRC)
	}
}

func (b *Builder) finishClient(out *outbound) {
	x := out.x
	if out.queued {
		k := tupleKey{client: x.Local, server: x.Remote}
		if q := b.tuples[k]; q != nil {
			q.clients = removeFrom(q.clients, out)
			b.dropEmpty(k, q)
		}
	}
	if out.client == nil {
		return
	}
	if b.injected[out.client.id] == out {
		delete(b.injected, out.client.id)
	}
	host, port := serverAuthority(x)
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attribute.String("http.request.method", x.Method),
		attribute.String("url.full", scheme(x)+"://"+hostPort(host, port, x.Host)+x.Path),
		attribute.String("server.address", host),
		attribute.Int("server.port", port),
		attribute.Int("network.local.port", int(x.Local.Port())),
	)
	if x.Status > 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", x.Status))
	}
	if out.rollout != "" {
		attrs = append(attrs, attribute.String("nemo.gym.rollout.id", out.rollout))
	}
	if out.unresolved != "" {
		attrs = append(attrs, attribute.String("gymtrace.parent.unresolved", out.unresolved))
	}
	// Gym's client spans are ERROR on exceptions (connection failures), never
	// on an HTTP error status.
	var status codes.Code
	var msg string
	if x.Err == http.ErrConnReset || x.Err == http.ErrClosed {
		status, msg = codes.Error, x.Err.Error()
		attrs = append(attrs, attribute.String("error.type", errorType(x.Err)))
	}
	name := "HTTP " + x.Method
	if x.Method == "_OTHER" {
		name = "HTTP"
	}
	b.emit(out.client, name, trace.SpanKindClient, groups.HTTPClient, x, attrs, status, msg, out.proc, nil, nil)
}

// scheme is "https" when the kernel read the exchange as TLS plaintext
// (OpenSSL probes, internal/tls), else "http".
func scheme(x *http.Exchange) string {
	if x.Flags()&loader.FlagTLS != 0 {
		return "https"
	}
	return "http"
}

func serverStatus(x *http.Exchange) (codes.Code, string, string) {
	switch {
	case x.Err == http.ErrConnReset || x.Err == http.ErrClosed:
		return codes.Error, x.Err.Error(), errorType(x.Err)
	case x.Status >= 500:
		// Semconv: HTTP status errors carry no description.
		return codes.Error, "", strconv.Itoa(x.Status)
	}
	return codes.Unset, "", ""
}

func errorType(err error) string {
	if err == http.ErrConnReset {
		return "connection_reset"
	}
	return "connection_closed"
}

func (b *Builder) appendGym(attrs []attribute.KeyValue, p *discover.Process, rollout string) []attribute.KeyValue {
	if p.ServerName != "" {
		attrs = append(attrs, attribute.String("nemo.gym.server.name", p.ServerName))
	}
	if rollout != "" {
		attrs = append(attrs, attribute.String("nemo.gym.rollout.id", rollout))
	}
	return attrs
}

func appendAddr(attrs []attribute.KeyValue, prefix string, ap netip.AddrPort) []attribute.KeyValue {
	if !ap.IsValid() {
		return attrs
	}
	return append(attrs,
		attribute.String(prefix+".address", ap.Addr().String()),
		attribute.Int(prefix+".port", int(ap.Port())))
}

// serverAuthority is the server a client request addressed: the Host header
// when it is well formed, else the connection's remote end.
func serverAuthority(x *http.Exchange) (string, int) {
	remotePort := int(x.Remote.Port())
	if h := x.Host; h != "" && validHost(h) {
		if ap, err := netip.ParseAddrPort(h); err == nil {
			return ap.Addr().String(), int(ap.Port())
		}
		if h[0] == '[' { // "[::1]" without a port
			if a, err := netip.ParseAddr(h[1 : len(h)-1]); err == nil && h[len(h)-1] == ']' {
				return a.String(), remotePort
			}
			return x.Remote.Addr().String(), remotePort
		}
		if i := lastColon(h); i >= 0 {
			if p, err := strconv.Atoi(h[i+1:]); err == nil && p > 0 && p < 65536 {
				return h[:i], p
			}
			return x.Remote.Addr().String(), remotePort
		}
		return h, remotePort
	}
	return x.Remote.Addr().String(), remotePort
}

func lastColon(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			return i
		}
	}
	return -1
}

// hostPort renders url.full's authority: the Host header as sent when it is
// well formed, else address:port.
func hostPort(host string, port int, hdr string) string {
	if hdr != "" && validHost(hdr) {
		return hdr
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// validHost accepts the characters of a host[:port] authority and nothing
// that could smuggle text into a URL (spaces, '/', '@', '?', '#', controls).
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '-', c == '_', c == ':', c == '[', c == ']', c == '%', c == '~':
		default:
			return false
		}
	}
	return len(h) > 0
}

func (b *Builder) emit(n *node, name string, kind trace.SpanKind, g groups.Group, x *http.Exchange,
	attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process, server, gym *reclass) {
	end := x.RespEnd
	if end < x.ReqStart {
		end = max(x.ReqEnd, x.ReqStart)
	}
	truncated := x.Err == http.ErrShutdown || x.Err == http.ErrEvicted
	b.emitHeld(n, name, kind, g, x.ReqStart, end, truncated, attrs, status, msg, p, x.Role, server, gym)
}

// emitSpan returns one finished span (start and end are kernel monotonic ns)
// unless its trace is not sampled.
func (b *Builder) emitSpan(n *node, name string, kind trace.SpanKind, g groups.Group, start, end uint64,
	truncated bool, attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process) {
	b.emitHeld(n, name, kind, g, start, end, truncated, attrs, status, msg, p, loader.RoleUnknown, nil, nil)
}

// emitHeld is emitSpan for a span its process's role may rename (put).
func (b *Builder) emitHeld(n *node, name string, kind trace.SpanKind, g groups.Group, start, end uint64,
	truncated bool, attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process,
	xRole uint8, server, gym *reclass) {
	if truncated {
		attrs = append(attrs, attribute.Bool("nemo.span.truncated", true))
		b.st.Truncated++
	}
	r := n.root()
	r.frozen = true
	if !r.sampled {
		b.st.Unsampled++
		return
	}
	if end < start {
		end = start
	}
	b.put(Span{
		Name:      name,
		Kind:      kind,
		SpanID:    n.id,
		Sampled:   true,
		Start:     b.opt.Clock.Wall(start),
		End:       b.opt.Clock.Wall(end),
		Attrs:     attrs,
		Status:    status,
		StatusMsg: msg,
		Group:     g.Name(),
		Proc:      p,
	}, n, g, xRole, server, gym)
}
