//go:build linux

package spans

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
)

// Span identity: the node behind each span, its trace id and sampling, and
// the inbound and outbound requests the Builder follows.

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
	// prov: a provisional gym.* span not settled yet (roles.go): spans
	// under it wait with it.
	prov bool
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
	gymCands groups.Mask // gym.prov: the groups its role may give it (roles.go)
	via      *outbound   // the client request on this node that sent it
	rollout  string
	idx      int // position in Builder.inflight[pid]
	waiting  bool
	done     bool // finished, waiting for its client's record (join.go, awaitClient)
	hasTP    bool
	tp       trace.SpanContext // the request's own traceparent, when hasTP
	pub      bool              // its trace context is published for injection
	ctxKeys  []ctxKey
	mark     uint64
	shadowed uint64
	sum      *rolloutSum // a /run's model calls so far (genai.go)
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
