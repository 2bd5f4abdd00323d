//go:build linux

package spans

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Roles by behaviour (docs/roles.md). A process's role comes from,
// in order: gymtrace's config (PID=ROLE), Gym's environment or command line
// (discovery), the kernel's record, and last what its traffic shows:
//
//   - it serves a route only one kind of server serves (/run: agent;
//     /v1/chat/completions, /v1/messages: model; /verify, /seed_session:
//     resources) — inferRole;
//   - it sends POST /run: the orchestrator (Gym's collector);
//   - it serves /v1/responses (with or without /ng-rollout/<id>) to another
//     process that is an agent, joined by the connection's 4-tuple or by the
//     traceparent gymtrace injected into that agent's call: a model server.
//
// A process whose role is not decided yet has its role-dependent spans held
// (bounded by holdMaxAge and holdMaxSpans), then named all the same way once
// it is, so names and gym.* spans do not depend on when the role became
// known. Past the bound they are named by route shape alone and counted
// (Stats.RoleUndecided). Role-dependent: a server span whose route some kind
// of Gym server names (or that carries /ng-rollout/<id>), a provisional
// gym.* span, and the spans under one. A process that serves only other
// routes (any non-Gym server, a resources server's tool routes) never waits.

const (
	holdMaxAge   = 3 * time.Second
	holdMaxSpans = 256
	// holdMaxAll bounds the held spans of a process with unsampled ones
	// (Options.Unsampled) counted too.
	holdMaxAll = 8 * holdMaxSpans
)

// holdQueue is one undecided process's finished spans.
type holdQueue struct {
	since   uint64 // kernel monotonic time the first span was held
	spans   []heldSpan
	sampled int // of spans, those to be exported: what holdMaxSpans bounds
}

// heldSpan is a finished span whose trace and parent ids are filled in on
// release: its parent may be a provisional gym.* span that the role decides
// away (node.alias).
type heldSpan struct {
	s      Span
	n      *node
	g      groups.Group
	server *reclass // a SERVER span: renamed by the decided role
	gym    *reclass // a provisional gym.* span: named or dropped by the role
}

// reclass is what a held server request's spans need to be named again.
type reclass struct {
	method, path string
	cands        groups.Mask // gym.*: the groups the span may belong to (enabled at request time)
}

// undecided reports whether process p's spans must wait for its role
// (xRole: what the kernel's record said).
func (b *Builder) undecided(p *discover.Process, xRole uint8) bool {
	return !b.gaveUp[uint32(p.PID)] && b.roleUnknown(p, xRole)
}

// roleUnknown: neither discovery, the kernel's record nor traffic names p's role.
func (b *Builder) roleUnknown(p *discover.Process, xRole uint8) bool {
	return p.Role == loader.RoleUnknown && xRole == loader.RoleUnknown && b.inferred[uint32(p.PID)] == groups.RoleUnknown
}

// decideRole records role r for process pid, inferred by rule why, unless it
// already has one. Requests in flight are named by it from now on, and the
// spans held for the process are released.
func (b *Builder) decideRole(pid uint32, p *discover.Process, r groups.Role, why string) {
	if r == groups.RoleUnknown || b.inferred[pid] != groups.RoleUnknown {
		return
	}
	b.inferred[pid] = r
	b.st.RoleInferred++
	if fp := b.procs[pid]; fp != nil && fp == p && p.Role == loader.RoleUnknown {
		// A process only the Builder knows: name its resource too.
		p.Role = uint8(r)
		if r == groups.RoleOrchestrator {
			p.ServerName = discover.TypeOrchestrator
		}
	}
	b.log.Info("role inferred from traffic", "pid", pid, "type", discover.TypeForRole(uint8(r)), "rule", why)
	for _, in := range b.inflight[pid] {
		b.reclassify(in, r)
	}
	b.release(pid, r)
}

// reclassify names an in-flight request of a process whose role was just
// decided (or given up on: RoleUnknown), and settles its provisional gym.*
// span.
func (b *Builder) reclassify(in *inbound, r groups.Role) {
	ri := classify(r, in.x.Method, in.x.Path)
	ri.rolloutID = in.ri.rolloutID
	if in.gym != nil && in.gym.prov {
		if ri.gymSpan == "" || !in.gymCands.Has(ri.gymGroup) {
			in.gym.alias = true
			if r == groups.RoleUnknown {
				b.st.GymSpanUnresolved++
			}
			if in.pub {
				b.publish(in) // its calls hang under the server span now
			}
		}
	}
	in.ri = ri
	if in.gym != nil {
		in.gym.prov = false
	}
}

// provisionalGym opens, for a request of an undecided process whose route
// has a gym.* span under some roles, a span that the role will name or drop.
func (b *Builder) provisionalGym(in *inbound, mask groups.Mask) bool {
	cands := in.ri.ambiguous & mask
	if cands == 0 || !b.undecided(in.proc, in.x.Role) {
		return false
	}
	in.gymCands = cands // requests.go marks the span it opens prov
	return true
}

// inferFromCaller applies the model rule to server request in, once its
// caller is known (at the request, or at a late connection join).
func (b *Builder) inferFromCaller(in *inbound) {
	if !servesResponses(in.x.Method, in.x.Path) || !b.undecided(in.proc, in.x.Role) {
		return
	}
	c := in.via
	if c == nil && in.hasTP {
		c = b.injected[in.tp.SpanID()]
	}
	if c == nil || c.x.PID == in.x.PID || b.role(c.proc, c.x) != groups.RoleAgent {
		return
	}
	b.decideRole(in.x.PID, in.proc, groups.RoleModel, "serves /v1/responses to an agent")
}

// roleSensitive reports whether a server request's span name depends on its
// process's role: some kind of Gym server has the route, or the path carries
// /ng-rollout/<id> (kept in the name's template on agents, stripped on models
// and resources).
func roleSensitive(method, path string) bool {
	if _, id := groups.StripRolloutPrefix(path); id != "" {
		return true
	}
	for _, r := range knownRoles {
		if _, ok := groups.MatchRoute(r, method, path); ok {
			return true
		}
	}
	return false
}

// provisionalAbove reports whether a provisional gym.* span not yet settled
// is among n's ancestors: n's parent id may still change.
func provisionalAbove(n *node) bool {
	for p, depth := n.parent, 0; p != nil && depth < 16; p, depth = p.parent, depth+1 {
		if p.prov {
			return true
		}
	}
	return false
}

func servesResponses(method, path string) bool {
	rest, _ := groups.StripRolloutPrefix(path)
	return method == "POST" && rest == "/v1/responses"
}

// inferFromCall applies the orchestrator rule to client request x.
func (b *Builder) inferFromCall(x *http.Exchange, p *discover.Process) {
	if x.Method == "POST" && x.Path == "/run" && b.role(p, x) == groups.RoleUnknown {
		b.decideRole(x.PID, p, groups.RoleOrchestrator, "sends POST /run")
	}
}

// put returns finished span s (node n, group g) now, or holds it while its
// process's role is undecided and the span depends on it. server (a server
// span on a role-dependent route) and gym (a provisional gym.* span) say how
// to rename it on release.
func (b *Builder) put(s Span, n *node, g groups.Group, xRole uint8, server, gym *reclass) {
	p := s.Proc
	pid := uint32(p.PID)
	if !b.undecided(p, xRole) || server == nil && gym == nil && !provisionalAbove(n) {
		if server != nil && b.gaveUp[pid] && b.roleUnknown(p, xRole) {
			b.st.RoleUndecided++ // named past the bound
		}
		b.output(heldSpan{s: s, n: n, g: g}, pid)
		return
	}
	if b.held == nil {
		b.held = make(map[uint32]*holdQueue)
	}
	q := b.held[pid]
	if q == nil {
		q = &holdQueue{since: b.opt.Clock.NowMono()}
		b.held[pid] = q
	}
	q.spans = append(q.spans, heldSpan{s: s, n: n, g: g, server: server, gym: gym})
	if s.Sampled {
		q.sampled++
		b.st.Held++
	}
	// Spans of unsampled traces (kept for metrics, Options.Unsampled) do
	// not hurry the sampled ones' naming; they have a bound of their own.
	if q.sampled >= holdMaxSpans || len(q.spans) >= holdMaxAll {
		b.giveUp(pid)
	}
}

// output fills in a span's trace and parent from its node and returns it.
func (b *Builder) output(h heldSpan, pid uint32) {
	s := h.s
	s.TraceID, s.Parent = h.n.root().traceID, h.n.parentID()
	s.Proc = b.effProc(s.Proc, pid)
	if s.Sampled {
		b.st.Spans[h.g]++
	}
	b.out = append(b.out, s)
}

// release returns pid's held spans, named for role r (RoleUnknown: by route
// shape alone).
func (b *Builder) release(pid uint32, r groups.Role) {
	q := b.held[pid]
	if q == nil {
		return
	}
	delete(b.held, pid)
	// Gym spans first: a dropped one must be an alias before its children's
	// parent ids are read.
	keep := q.spans[:0]
	for _, h := range q.spans {
		if h.gym == nil {
			keep = append(keep, h)
			continue
		}
		ri := classify(r, h.gym.method, h.gym.path)
		if ri.gymSpan == "" || !h.gym.cands.Has(ri.gymGroup) {
			h.n.alias, h.n.prov = true, false
			if r == groups.RoleUnknown {
				b.st.GymSpanUnresolved++
			}
			continue
		}
		h.s.Name, h.s.Group, h.g = ri.gymSpan, ri.gymGroup.Name(), ri.gymGroup
		h.n.prov = false
		keep = append(keep, h)
	}
	for _, h := range keep {
		if h.server != nil {
			ri := classify(r, h.server.method, h.server.path)
			h.s.Name = serverSpanName(h.server.method, ri.route)
			if ri.route != "" {
				h.s.Attrs = setAttr(h.s.Attrs, attribute.String("http.route", ri.route))
			}
		}
		if r == groups.RoleUnknown && (h.server != nil || h.gym != nil) {
			b.st.RoleUndecided++
		}
		b.output(h, pid)
	}
}

// giveUp stops holding pid's spans: they are named by route shape from now
// on, until (if ever) its role is decided.
func (b *Builder) giveUp(pid uint32) {
	if b.gaveUp == nil {
		b.gaveUp = make(map[uint32]bool)
	}
	b.gaveUp[pid] = true
	b.log.Info("role not decided: naming this process's spans by route shape alone",
		"pid", pid, "held", len(b.held[pid].spans), "rules", "docs/roles.md")
	for _, in := range b.inflight[pid] {
		b.reclassify(in, groups.RoleUnknown)
	}
	b.release(pid, groups.RoleUnknown)
}

// expireHolds gives up on the processes whose spans were held past
// holdMaxAge.
func (b *Builder) expireHolds() {
	if len(b.held) == 0 {
		return
	}
	now := b.opt.Clock.NowMono()
	for pid, q := range b.held {
		if now-q.since >= uint64(holdMaxAge) {
			b.giveUp(pid)
		}
	}
}

// effProc is the process a span's resource describes: discovery's, with the
// role the Builder inferred when discovery has none.
func (b *Builder) effProc(p *discover.Process, pid uint32) *discover.Process {
	if p == nil || p.Role != loader.RoleUnknown {
		return p
	}
	r := b.inferred[pid]
	if r == groups.RoleUnknown {
		return p
	}
	if c := b.roleProcs[pid]; c != nil && c.src == p {
		return c.cp
	}
	cp := *p
	cp.Role = uint8(r)
	if r == groups.RoleOrchestrator && cp.ServerName == "" {
		cp.ServerName = discover.TypeOrchestrator
	}
	if b.roleProcs == nil {
		b.roleProcs = make(map[uint32]*roleProc)
	}
	b.roleProcs[pid] = &roleProc{src: p, cp: &cp}
	return &cp
}

// roleProc is a copy of discovery's Process with the inferred role set;
// discovery's own is never written (its watcher reads it concurrently).
type roleProc struct{ src, cp *discover.Process }

// noteInjected remembers the CLIENT span whose id gymtrace wrote into a
// call's traceparent, so the server that reads it knows its caller.
func (b *Builder) noteInjected(id trace.SpanID, out *outbound) {
	if b.injected == nil {
		b.injected = make(map[trace.SpanID]*outbound)
	}
	b.injected[id] = out
}

// serverSpanName is "{method} {route}", or the method alone when the path
// is unknown (http.PathOf), as OTel's HTTP conventions name a span without
// a route.
func serverSpanName(method, route string) string {
	if method == "_OTHER" {
		method = "HTTP"
	}
	if route == "" {
		return method
	}
	return method + " " + route
}

// appendPath adds a SERVER span's url.path and http.route, or, when the
// kernel did not see the whole path, gymtrace.path.incomplete instead.
func appendPath(attrs []attribute.KeyValue, x *http.Exchange, route string) []attribute.KeyValue {
	if x.PathUnknown {
		return append(attrs, attribute.Bool("gymtrace.path.incomplete", true))
	}
	return append(attrs, attribute.String("url.path", x.Path), attribute.String("http.route", route))
}

func setAttr(attrs []attribute.KeyValue, kv attribute.KeyValue) []attribute.KeyValue {
	for i := range attrs {
		if attrs[i].Key == kv.Key {
			attrs[i] = kv
			return attrs
		}
	}
	return append(attrs, kv)
}
