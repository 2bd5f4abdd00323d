//go:build linux

package spans

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
	// Unsampled returns the spans of traces the sampler dropped too, with
	// Sampled false: metrics count every request, exporters skip them.
	Unsampled bool
	Logger    *slog.Logger
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
	ParentOnlyInFlight   uint64               // client requests attributed to the one inbound request in flight (no context)
	ParentImpossible     uint64               // client requests the kernel bound to a request that began after them (left unparented)
	ParentNone           uint64               // client requests with no inbound request in flight: roots
	ParentAmbiguous      uint64               // client requests with several candidate inbound requests: roots marked unresolved
	ParentNotTraced      uint64               // ... whose cause the kernel named is not traced (gated off, lost, before attach)
	ParentUnbound        uint64               // ... whose asyncio context no traced request is bound to (cause.go)
	ParentRecordsLost    uint64               // ... of a process that lost records: what is in flight proves nothing
	ParentNoContext      uint64               // ... of which the process's asyncio context cannot be read (an unrecognised uvloop build)
	JoinedTuple          uint64               // server spans joined to a client span on this node by connection
	JoinedStream         uint64               // server requests paired with their client request by TCP stream position (join.go)
	JoinedIndex          uint64               // ... by request index on a connection both ends followed whole (TLS)
	JoinUnprovable       uint64               // requests dropped from a join queue unpaired: no proof matched (join.go)
	LateExpired          uint64               // finished server requests whose client's record did not come in time: out unjoined
	LateJoins            uint64               // ... of which the client's record arrived after the server's
	JoinedAfterEnd       uint64               // ... of which after the server had answered (AwaitedClient)
	AwaitedClient        uint64               // finished server requests kept for their client's record (join.go)
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
	StartupUnidentified  uint64 // processes that answered under a launch shell and were never named a Gym server (discovery) before it exited: no startup spans
	OpenServer           int    // inbound exchanges in flight
	OpenClient           int    // outbound exchanges in flight
	JoinQueue            int    // client requests waiting for a server on this node (or their own response)
	OpenJobs             int    // gym.job spans begun, their collector still running
	OpenSandboxes        int    // gym.sandbox.* spans begun, their CLI still running
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
	// pid -> what keeps cause() from choosing among the requests in flight:
	// causeCtx, its records carry the asyncio context (the kernel binds its
	// calls, or nothing may); causeLossy, a record of it was lost, so the
	// set in flight may lack the very request.
	noGuess map[uint32]uint8
	counts  map[uint32]*ReqCounts
	// Roles by behaviour (roles.go).
	held      map[uint32]*holdQueue
	gaveUp    map[uint32]bool
	roleProcs map[uint32]*roleProc
	injected  map[trace.SpanID]*outbound // open CLIENT spans whose id is on the wire
	// Late joins (join.go): finished server requests waiting for their
	// client's record, the connections known to have a traced client, and
	// those a wait gave up on (no traced client).
	late      []lateServer
	watermark uint64 // the newest kernel timestamp read (noteTime)
	pairs     map[tupleKey]struct{}
	lonely    map[tupleKey]struct{}
}

// ReqCounts are what a process did since it was first seen (Counts): HTTP
// requests served (read), answered (a response written) and made, sandbox
// CLIs included in Made (calls out, whose parents need its asyncio context).
type ReqCounts struct{ Served, Answered, Made uint64 }

func (b *Builder) countsOf(pid uint32) *ReqCounts {
	c := b.counts[pid]
	if c == nil {
		c = &ReqCounts{}
		b.counts[pid] = c
	}
	return c
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
	if len(b.late) > 0 {
		b.expireLate(b.opt.Clock.NowMono(), 0)
	}
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
	delete(b.noGuess, uint32(pid))
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
	c := b.countsOf(x.PID)
	if x.Side == loader.SideServer {
		c.Served++
	} else {
		c.Made++
	}
	b.noteTime(x.ReqEnd)
	b.noteGuess(x)
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
	if !errors.Is(x.Err, http.ErrEvicted) && !errors.Is(x.Err, http.ErrShutdown) {
		b.noteTime(x.RespEnd) // a kernel timestamp (those two ends are the agent's clock)
	}
	if x.Side == loader.SideServer && x.Err == nil && x.Status != 0 {
		b.countsOf(x.PID).Answered++
	}
	if x.Err == http.ErrResponseLost {
		b.noGuessFor(x.PID, causeLossy)
	}
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
	b.expireLate(^uint64(0), 0)
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
