//go:build linux

package spans

import (
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// A request's spans are decided when its record arrives: ids, parents, the
// gym.* span, the rollout id.

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
		in.gym.prov = provisional
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
