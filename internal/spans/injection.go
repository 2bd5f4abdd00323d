//go:build linux

package spans

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/groups"
)

// The Builder's side of traceparent injection (docs/injection.md): the trace
// contexts it publishes to the kernel, and the ids the kernel put on the wire.

// jobIDs are a collector's gym.job ids, decided and published before its
// first call (PrepareJob) so that even its first calls carry the job's trace.
type jobIDs struct {
	trace   trace.TraceID
	span    trace.SpanID
	sampled bool
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
