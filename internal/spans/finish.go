//go:build linux

package spans

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// A finished exchange becomes its spans: status, attributes, emission.

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
	for _, k := range in.ctxKeys {
		if cur, ok := b.ctx[k]; ok && (cur == in || cur == nil) {
			delete(b.ctx, k)
		}
	}
	if in.waiting {
		if b.awaitClient(in) {
			return // its spans go out when the client's record joins it, or at its deadline (join.go)
		}
		k := tupleKey{client: x.Remote, server: x.Local}
		if q := b.tuples[k]; q != nil {
			q.servers = removeFrom(q.servers, in)
			b.dropEmpty(k, q)
		}
	}
	b.emitServer(in)
}

// emitServer returns a finished server request's SERVER and gym.* spans.
func (b *Builder) emitServer(in *inbound) {
	x := in.x
	status, msg, errType := serverStatus(x)
	// While the process's role is undecided its spans are held, and named
	// again when it is (roles.go).
	start, end := serverBounds(in)
	var rc *reclass
	if b.role(in.proc, x) == groups.RoleUnknown && roleSensitive(x.Method, x.Path) {
		rc = &reclass{method: x.Method, path: x.Path, cands: in.gymCands}
	}
	// A model call: its GenAI values on its gym.model.* span, or on its
	// SERVER span when model_call is off; its tokens in its rollout's sum.
	model := isModelCall(in)
	var ga *GenAIMeasures
	if model {
		addToRollout(in)
		ga = genaiMeasures(in)
	}
	genaiOnServer := model && x.GenAI != nil && (in.gym == nil || in.gym.alias)
	if in.server != nil {
		name := serverSpanName(x.Method, in.ri.route)
		attrs := make([]attribute.KeyValue, 0, 14)
		attrs = append(attrs,
			attribute.String("http.request.method", x.Method),
			attribute.String("url.scheme", scheme(x)),
		)
		attrs = appendPath(attrs, x, in.ri.route)
		if x.Status > 0 {
			attrs = append(attrs, attribute.Int("http.response.status_code", x.Status))
		}
		attrs = appendAddr(attrs, "server", x.Local)
		attrs = appendAddr(attrs, "client", x.Remote)
		attrs = b.appendGym(attrs, in.proc, in.rollout)
		if errType != "" {
			attrs = append(attrs, attribute.String("error.type", errType))
		}
		if genaiOnServer {
			attrs = genaiAttrs(attrs, x.GenAI)
		}
		b.emit(in.server, name, trace.SpanKindServer, groups.Server, x, start, end, attrs, status, msg, in.proc, rc, nil, nil)
	}
	if in.gym != nil && !in.gym.alias {
		attrs := b.appendGym(make([]attribute.KeyValue, 0, 3), in.proc, in.rollout)
		var gymRC *reclass
		if in.gym.prov {
			gymRC = rc
		}
		var add func(*Measures)
		switch {
		case model:
			if x.GenAI != nil {
				attrs = genaiAttrs(attrs, x.GenAI)
			}
			add = func(ms *Measures) {
				ms.GenAI = ga
				if x.RespStart >= x.ReqStart && x.Status > 0 {
					ms.TTFB = x.RespStart - x.ReqStart
				}
			}
		case in.ri.gymGroup == groups.Rollout:
			attrs = rolloutAttrs(attrs, in.sum)
			rm := rolloutMeasures(in.sum)
			add = func(ms *Measures) { ms.Rollout = rm }
		}
		b.emit(in.gym, in.ri.gymSpan, trace.SpanKindInternal, in.ri.gymGroup, x, start, end, attrs, status, msg, in.proc, nil, gymRC, add)
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
	countMadeCall(out)
	if out.client == nil {
		return
	}
	if b.injected[out.client.id] == out {
		delete(b.injected, out.client.id)
	}
	host, port := serverAuthority(x)
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, attribute.String("http.request.method", x.Method))
	if x.PathUnknown {
		attrs = append(attrs, attribute.Bool("gymtrace.path.incomplete", true))
	} else {
		attrs = append(attrs, attribute.String("url.full", scheme(x)+"://"+hostPort(host, port, x.Host)+x.Path))
	}
	attrs = append(attrs,
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
	// A model server's own call upstream (the kernel walks no other CLIENT
	// exchange): its GenAI values, marked upstream; never a rollout's
	// (countMadeCall, addToRollout) nor Gym's metrics' (no Measures.GenAI).
	if x.GenAI != nil {
		attrs = genaiAttrs(attrs, x.GenAI)
		attrs = append(attrs, attribute.Bool("nemo.gym.model.upstream", true))
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
	start, end := spanBounds(x)
	b.emit(out.client, name, trace.SpanKindClient, groups.HTTPClient, x, start, end, attrs, status, msg, out.proc, nil, nil, nil)
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

// spanBounds is an exchange's span: from its request's first byte to its
// response's last (or, with no response, its request's end).
func spanBounds(x *http.Exchange) (start, end uint64) {
	end = x.RespEnd
	if end < x.ReqStart {
		end = max(x.ReqEnd, x.ReqStart)
	}
	return x.ReqStart, end
}

// serverBounds is a server request's span, inside the span of the client
// request on this node that sent it: its parent, joined by the connection's
// tuple or named by the traceparent the request carried (the one gymtrace
// injected gives the CLIENT span's own id). Each end's times are its syscalls'
// exits, and a syscall that moves a large buffer returns after the peer has
// seen its first bytes: a 1 MiB upload's write(2) exits after the server's
// read of the head, a download's read after the server's last write began.
// The server's span would then start before its parent's, or end after it.
// Both moments lie inside the syscalls that overlap, so the span is clamped
// to its parent's; the exchange (and Gym's duration metrics) keep the
// kernel's times.
func serverBounds(in *inbound) (start, end uint64) {
	start, end = spanBounds(in.x)
	if in.via == nil || in.server == nil || in.via.client == nil || !childOf(in.server, in.via.client) {
		return start, end
	}
	c := in.via.x
	if c.ReqStart > start && c.ReqStart <= end {
		start = c.ReqStart
	}
	if c.RespEnd != 0 && c.RespEnd < end && c.RespEnd >= start {
		end = c.RespEnd
	}
	return start, end
}

// childOf: parent is n's parent span, by its node or by the span id of the
// traceparent n was given.
func childOf(n, parent *node) bool {
	if n.parent != nil {
		return n.parent == parent
	}
	return n.remote.IsValid() && n.remote == parent.id
}

func (b *Builder) emit(n *node, name string, kind trace.SpanKind, g groups.Group, x *http.Exchange, start, end uint64,
	attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process, server, gym *reclass, add func(*Measures)) {
	// A lost response record: the span ends at the latest moment its
	// response can have ended (http.ErrResponseLost), and says it is cut.
	truncated := x.Err == http.ErrShutdown || x.Err == http.ErrEvicted || x.Err == http.ErrResponseLost
	if x.Err == http.ErrResponseLost {
		attrs = append(attrs, attribute.String("gymtrace.record.lost", "response"))
	}
	if x.Lost {
		// A record of this connection was lost just before this request's:
		// what depended on it (a join, a parent, a rollout's wholeness) may
		// be missing here.
		attrs = append(attrs, attribute.Bool("gymtrace.connection.gap", true))
	}
	if x.Late {
		// Its request's record came late, after the records of any call
		// its handler made before that (left unparented).
		attrs = append(attrs, attribute.String("gymtrace.record.late", "request"))
	}
	if debugRecords {
		attrs = appendDebug(attrs, x)
	}
	ms := Measures{ReqBody: x.ReqBodyLen, RespBody: x.RespBodyLen, Host: x.Host, Status: x.Status,
		Reward: x.Reward, HasReward: x.HasReward}
	if add != nil {
		add(&ms)
	}
	b.emitHeld(n, name, kind, g, start, end, truncated, attrs, status, msg, p, x.Role, server, gym, ms)
}

// emitSpan returns one finished span (start and end are kernel monotonic ns)
// unless its trace is not sampled.
func (b *Builder) emitSpan(n *node, name string, kind trace.SpanKind, g groups.Group, start, end uint64,
	truncated bool, attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process) {
	b.emitHeld(n, name, kind, g, start, end, truncated, attrs, status, msg, p, loader.RoleUnknown, nil, nil, Measures{})
}

// emitHeld is emitSpan for a span its process's role may rename (put).
func (b *Builder) emitHeld(n *node, name string, kind trace.SpanKind, g groups.Group, start, end uint64,
	truncated bool, attrs []attribute.KeyValue, status codes.Code, msg string, p *discover.Process,
	xRole uint8, server, gym *reclass, ms Measures) {
	if truncated {
		attrs = append(attrs, attribute.Bool("nemo.span.truncated", true))
		b.st.Truncated++
	}
	r := n.root()
	r.frozen = true
	if !r.sampled {
		b.st.Unsampled++
		if !b.opt.Unsampled {
			return
		}
	}
	if end < start {
		end = start
	}
	b.put(Span{
		Name:      name,
		Kind:      kind,
		SpanID:    n.id,
		Sampled:   r.sampled,
		Start:     b.opt.Clock.Wall(start),
		End:       b.opt.Clock.Wall(end),
		Attrs:     attrs,
		Status:    status,
		StatusMsg: msg,
		Group:     g.Name(),
		Proc:      p,
		Measures:  ms,
	}, n, g, xRole, server, gym)
}
