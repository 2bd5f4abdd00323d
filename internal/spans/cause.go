//go:build linux

package spans

import "github.com/gymtrace/gymtrace/internal/http"

// Which inbound request's handler made an outbound call: the kernel's
// asyncio context first, then contexts bound by BindContext, then nesting.

type ctxKey struct {
	pid uint32
	ctx uint64
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

// cause picks the inbound request whose handler made outbound request x.
// Never a guess between unrelated requests: with several candidates that do
// not form one chain, it returns nil and sets *why.
func (b *Builder) cause(x *http.Exchange, why *string) *inbound {
	// The kernel bound the call to its inbound request through the asyncio
	// context (bpf/python.h): exact, whatever else is in flight.
	if x.CauseConn != 0 {
		for _, in := range b.inflight[x.PID] {
			if in.x.ConnID != x.CauseConn || in.x.Seq != x.CauseSeq {
				continue
			}
			if in.x.ReqStart > x.ReqStart {
				// A handler runs after its request was read: a request
				// that began after the call cannot have made it. Never
				// seen; a wrong binding must not become a parent.
				b.st.ParentNone++
				b.st.ParentImpossible++
				*why = "cause_after_call"
				return nil
			}
			b.st.ParentByContext++
			return in
		}
		// Its request is not traced (gated off, or before attach): the call
		// has no parent here, as in Gym when that request has no span.
		b.st.ParentNone++
		b.st.ParentNotTraced++
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
	if g := b.noGuess[x.PID]; x.PyCtx != 0 || g != 0 {
		// The kernel reads this process's asyncio contexts, and no request
		// is bound to this call's: its handler's request record was lost,
		// or its task was born before gymtrace attached. Or records of the
		// process were lost. What else is in flight proves nothing then
		// (the set may lack the very request): unattributed.
		b.st.ParentNone++
		if g&causeCtx == 0 && x.PyCtx == 0 {
			b.st.ParentRecordsLost++
			*why = "records_lost"
		} else {
			b.st.ParentUnbound++
			*why = "context_unbound"
		}
		return nil
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
		b.st.ParentOnlyInFlight++
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

const (
	causeCtx   uint8 = 1 << iota // the process's records carry asyncio contexts
	causeLossy                   // a record of the process was lost
)

// noteGuess learns from request x whether its process's calls may still be
// attributed by what is in flight (cause): not once its records carry the
// asyncio context (the kernel's binding is the proof there, and its absence
// is no licence to guess), nor once one of its records was lost.
func (b *Builder) noteGuess(x *http.Exchange) {
	if x.PyCtx != 0 || x.CauseConn != 0 {
		b.noGuessFor(x.PID, causeCtx)
	}
	if x.Lost {
		b.noGuessFor(x.PID, causeLossy)
	}
}

func (b *Builder) noGuessFor(pid uint32, why uint8) {
	if b.noGuess[pid]&why != 0 {
		return
	}
	if b.noGuess == nil {
		b.noGuess = map[uint32]uint8{}
	}
	b.noGuess[pid] |= why
}
