//go:build linux

package spans

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// sim is a one-node network of Gym processes that writes the records the
// kernel would: a client's REQUEST before the server's, the server's RESPONSE
// before the client's, and nothing for a message the gate drops.
type sim struct {
	t       testing.TB
	now     uint64
	conns   uint64
	ports   uint16
	mask    groups.Mask // what the emulated kernel gate lets through
	noGate  bool        // GT_CFG_NO_GATE: emit everything, filter in Go
	procs   map[uint32]*discover.Process
	traced  map[uint32]bool
	p       *Pipeline
	b       *Builder
	spans   []Span
	lateCli bool   // deliver the client's REQUEST after the server's
	cliLag  uint64 // with lateCli: the client's write returns this much after the server's read
	// cliLast: the client's REQUEST record comes after the server's whole
	// exchange (its program took its timestamp first, reserved last).
	cliLast bool
	// srvLate: the server's REQUEST record comes late, just before its
	// RESPONSE (loader.GapLate: the ring had no room when it ended).
	srvLate bool
	// midStream: connections picked up mid-stream (no loader.FlagFresh), so
	// without stream positions (withStream) nothing proves a join.
	midStream bool
	rec       [][]byte // when recording, records are kept here instead of processed
	record    bool
}

const (
	pidCollector = 100
	pidAgent     = 200
	pidModel     = 300
	pidResources = 400
)

func newSim(t testing.TB, spec string) *sim {
	t.Helper()
	mask, err := groups.Resolve(spec)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, mask: mask, ports: 40000,
		procs: map[uint32]*discover.Process{
			pidAgent:     {PID: pidAgent, Role: loader.RoleAgent, ServerName: "simple_agent"},
			pidModel:     {PID: pidModel, Role: loader.RoleModel, ServerName: "policy_model"},
			pidResources: {PID: pidResources, Role: loader.RoleResources, ServerName: "weather"},
		},
		traced: map[uint32]bool{pidAgent: true, pidModel: true, pidResources: true},
	}
	b, err := NewBuilder(Options{
		Mask:   mask,
		Lookup: func(pid int) *discover.Process { return s.procs[uint32(pid)] },
		IDs:    &SequentialIDs{},
		Clock:  http.NewClockWithOffset(time.Duration(1_700_000_000) * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.b = b
	s.p = NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
	return s
}

func (s *sim) tick() uint64 { s.now += 1000; return s.now }

// simConn is one TCP connection between two processes.
type simConn struct {
	s                *sim
	cliPID, srvPID   uint32
	cli, srv         netip.AddrPort
	cliConn, srvConn uint64
	host             string
	seq              uint64
}

func (s *sim) dial(cliPID, srvPID uint32, srvAddr string) *simConn {
	srv := netip.MustParseAddrPort(srvAddr)
	s.ports++
	s.conns += 2
	return &simConn{s: s, cliPID: cliPID, srvPID: srvPID,
		cli: netip.AddrPortFrom(srv.Addr(), s.ports), srv: srv,
		cliConn: s.conns - 1, srvConn: s.conns, host: srvAddr}
}

// call is one request in flight on a simConn.
type call struct {
	c        *simConn
	method   uint8
	path     string
	cliGroup groups.Mask
	srvGroup groups.Mask
	heldCli  *loader.HTTPEvent // cliLast: the client's REQUEST, fed after the server's RESPONSE
	heldSrv  *loader.HTTPEvent // srvLate: the server's REQUEST, fed just before its RESPONSE
	seq      uint64            // the request's index on its connection (both ends' kernels count alike)
}

type reqOpt func(ev *loader.HTTPEvent)

func withTraceparent(tp string) reqOpt {
	return func(ev *loader.HTTPEvent) {
		ev.Flags |= loader.FlagTraceparent
		copy(ev.Traceparent[:], tp)
	}
}

func withRollout(task, idx, attempt int32) reqOpt {
	return func(ev *loader.HTTPEvent) {
		ev.Flags |= loader.FlagRollout
		ev.Rollout.Task, ev.Rollout.Rollout, ev.Rollout.Attempt = task, idx, attempt
	}
}

func withFlags(f uint16) reqOpt { return func(ev *loader.HTTPEvent) { ev.Flags |= f } }

func withCtx(ctx uint64) reqOpt { return func(ev *loader.HTTPEvent) { ev.PyCtx = ctx } }

func (s *sim) event(kind, side uint8, pid uint32, conn uint64, local, remote netip.AddrPort) *loader.HTTPEvent {
	ev := &loader.HTTPEvent{Kind: kind, Side: side, Pid: pid, Tid: pid, ConnId: conn}
	ev.StartNs = s.tick()
	ev.EndNs = s.tick()
	// As16 gives IPv4 as IPv4-mapped IPv6, as the kernel writes it.
	ev.Tuple.Laddr, ev.Tuple.Raddr = local.Addr().As16(), remote.Addr().As16()
	ev.Tuple.Family = 10
	if local.Addr().Is4() {
		ev.Tuple.Family = 2
	}
	ev.Tuple.Lport, ev.Tuple.Rport = local.Port(), remote.Port()
	if s.procs[pid] != nil {
		ev.Role = s.procs[pid].Role
	}
	return ev
}

func (s *sim) feed(ev *loader.HTTPEvent) {
	if !s.noGate && groups.Mask(ev.Groups)&s.mask == 0 {
		return // the kernel gate: nothing reserved in the ring buffer
	}
	if s.record {
		s.rec = append(s.rec, http.Encode(ev))
		return
	}
	out, err := s.p.Process(http.Encode(ev))
	if err != nil {
		s.t.Fatalf("Process: %v", err)
	}
	s.spans = append(s.spans, out...)
}

func (c *simConn) request(method uint8, path string, opts ...reqOpt) *call {
	s := c.s
	k := &call{c: c, method: method, path: path, cliGroup: groups.HTTPClient.Mask(), seq: c.seq}
	role := groups.RoleUnknown
	if p := s.procs[c.srvPID]; p != nil {
		role = groups.Role(p.Role)
	}
	k.srvGroup = groups.Server.Mask()
	if rt, ok := groups.MatchRoute(role, http.MethodName(method), path); ok {
		k.srvGroup |= rt.Groups
	} else if role == groups.RoleUnknown {
		k.srvGroup = groups.ServerPossible(groups.RoleUnknown)
	}
	mk := func(side uint8, pid uint32, conn uint64, local, remote netip.AddrPort, g groups.Mask) *loader.HTTPEvent {
		ev := s.event(loader.EvRequest, side, pid, conn, local, remote)
		ev.Method = method
		ev.PathLen = uint16(copy(ev.Path[:], path))
		ev.Groups = uint64(g)
		ev.Seq = c.seq
		if !s.midStream {
			ev.Flags |= loader.FlagFresh
		}
		for _, o := range opts {
			o(ev)
		}
		if side == loader.SideClient {
			ev.Flags |= loader.FlagHost
			ev.HostLen = uint16(copy(ev.Host[:], c.host))
		}
		return ev
	}
	var cli, srv *loader.HTTPEvent
	if s.traced[c.cliPID] {
		cli = mk(loader.SideClient, c.cliPID, c.cliConn, c.cli, c.srv, k.cliGroup)
	}
	if s.traced[c.srvPID] {
		srv = mk(loader.SideServer, c.srvPID, c.srvConn, c.srv, c.cli, k.srvGroup)
		if cli != nil {
			srv.StartNs, srv.EndNs = cli.StartNs+1, s.tick()
		}
	}
	if s.lateCli {
		if cli != nil && s.cliLag != 0 {
			// The woken reader ran first: the writer's syscall exit (its
			// timestamp) comes after the reader has read the whole request.
			cli.StartNs, cli.EndNs = srv.EndNs+s.cliLag, srv.EndNs+s.cliLag+1
			s.now = cli.EndNs
		}
		cli, srv = srv, cli
	}
	if s.cliLast && cli != nil && srv != nil {
		k.heldCli, cli = cli, nil
	}
	if s.srvLate && srv != nil {
		srv.Gap |= loader.GapLate
		k.heldSrv, srv = srv, nil
	}
	for _, ev := range []*loader.HTTPEvent{cli, srv} {
		if ev != nil {
			s.feed(ev)
		}
	}
	c.seq++
	return k
}

func (k *call) respond(status uint16) { k.respondFlags(status, 0, 0) }

func (k *call) respondFlags(status uint16, srvFlags, cliFlags uint16) {
	c, s := k.c, k.c.s
	if k.heldSrv != nil {
		s.feed(k.heldSrv)
		k.heldSrv = nil
	}
	if s.traced[c.srvPID] {
		ev := s.event(loader.EvResponse, loader.SideServer, c.srvPID, c.srvConn, c.srv, c.cli)
		ev.Status, ev.Groups, ev.Flags, ev.Seq = status, uint64(k.srvGroup), srvFlags, k.seq
		s.feed(ev)
	}
	if k.heldCli != nil {
		s.feed(k.heldCli)
		k.heldCli = nil
	}
	if s.traced[c.cliPID] {
		ev := s.event(loader.EvResponse, loader.SideClient, c.cliPID, c.cliConn, c.cli, c.srv)
		ev.Status, ev.Groups, ev.Flags, ev.Seq = status, uint64(k.cliGroup), cliFlags, k.seq
		s.feed(ev)
	}
}

// closeClient: the client's connection dies (reset when reset is true).
func (c *simConn) closeSide(pid uint32, reset bool) {
	s := c.s
	var flags uint16
	if reset {
		flags = loader.FlagConnError
	}
	if pid == c.cliPID {
		ev := s.event(loader.EvClose, loader.SideClient, pid, c.cliConn, c.cli, c.srv)
		ev.Flags, ev.Groups = flags, uint64(groups.AllGroups)
		s.feed(ev)
	} else {
		ev := s.event(loader.EvClose, loader.SideServer, pid, c.srvConn, c.srv, c.cli)
		ev.Flags, ev.Groups = flags, uint64(groups.AllGroups)
		s.feed(ev)
	}
}

// gymStack holds the keep-alive connections of a Gym stack, as aiohttp pools them.
type gymStack struct {
	s                                        *sim
	collAgent, agentRes, agentSelf, agentMod []*simConn
}

const (
	agentAddr = "127.0.0.1:8001"
	modelAddr = "127.0.0.1:8002"
	resAddr   = "127.0.0.1:8003"
)

func newGymStack(s *sim, v6 bool) *gymStack {
	a, m, r := agentAddr, modelAddr, resAddr
	if v6 {
		a, m, r = "[::1]:8001", "[::1]:8002", "[::1]:8003"
	}
	g := &gymStack{s: s}
	for i := 0; i < 4; i++ {
		g.collAgent = append(g.collAgent, s.dial(pidCollector, pidAgent, a))
		g.agentRes = append(g.agentRes, s.dial(pidAgent, pidResources, r))
		g.agentSelf = append(g.agentSelf, s.dial(pidAgent, pidAgent, a))
		g.agentMod = append(g.agentMod, s.dial(pidAgent, pidModel, m))
	}
	return g
}

// rollout runs one simple-agent rollout at concurrency 1, as gym-facts.md
// describes it, on the i-th pooled connections.
func (g *gymStack) rollout(i int, task, idx int32) {
	run := g.collAgent[i].request(loader.MethodPOST, "/run", withRollout(task, idx, -1))
	g.agentRes[i].request(loader.MethodPOST, "/seed_session").respond(200)
	resp := g.agentSelf[i].request(loader.MethodPOST, "/v1/responses")
	g.agentMod[i].request(loader.MethodPOST, "/v1/responses").respond(200)
	g.agentRes[i].request(loader.MethodPOST, "/get_weather").respond(200)
	g.agentMod[i].request(loader.MethodPOST, "/v1/responses").respond(200)
	resp.respond(200)
	g.agentRes[i].request(loader.MethodPOST, "/verify").respond(200)
	run.respond(200)
}

var portNames = map[uint16]string{8001: "agent", 8002: "model", 8003: "resources"}

// desc names a span for comparisons: "<process>:<name>", and for a client
// span the server it called and the path.
func desc(sp Span) string {
	proc := "?"
	if sp.Proc != nil {
		proc = sp.Proc.ServerName
	}
	d := proc + ":" + sp.Name
	if sp.Name == "HTTP POST" || sp.Name == "HTTP GET" {
		port, _ := attr(sp, "server.port")
		path := ""
		if u, ok := attr(sp, "url.full"); ok {
			us := u.AsString()
			path = us[strings.Index(us[len("http://"):], "/")+len("http://"):]
		}
		d += " ->" + portNames[uint16(port.AsInt64())] + path
	}
	return d
}

func attr(sp Span, key string) (v attrValue, ok bool) {
	for _, kv := range sp.Attrs {
		if string(kv.Key) == key {
			return attrValue{kv.Value.AsInterface()}, true
		}
	}
	return attrValue{}, false
}

type attrValue struct{ v any }

func (a attrValue) AsString() string {
	s, _ := a.v.(string)
	return s
}
func (a attrValue) AsInt64() int64 {
	i, _ := a.v.(int64)
	return i
}

// edges renders each span as "child <- parent" ("<- ROOT" for roots, "<- REMOTE"
// for a parent outside the set), sorted, and checks ids and trace ids agree.
func edges(t testing.TB, spans []Span) []string {
	t.Helper()
	byID := map[[8]byte]Span{}
	for _, sp := range spans {
		if _, dup := byID[sp.SpanID]; dup {
			t.Errorf("duplicate span id %v", sp.SpanID)
		}
		byID[sp.SpanID] = sp
	}
	var out []string
	for _, sp := range spans {
		switch p, ok := byID[sp.Parent]; {
		case !sp.Parent.IsValid():
			out = append(out, desc(sp)+" <- ROOT")
		case ok:
			if p.TraceID != sp.TraceID {
				t.Errorf("%s is in trace %v but its parent %s is in %v", desc(sp), sp.TraceID, desc(p), p.TraceID)
			}
			if sp.Start.Before(p.Start) {
				t.Errorf("%s starts before its parent %s", desc(sp), desc(p))
			}
			out = append(out, desc(sp)+" <- "+desc(p))
		default:
			out = append(out, desc(sp)+" <- REMOTE")
		}
	}
	sort.Strings(out)
	return out
}

func traces(spans []Span) int {
	ids := map[[16]byte]bool{}
	for _, sp := range spans {
		ids[sp.TraceID] = true
	}
	return len(ids)
}

func diffEdges(t testing.TB, got, want []string) {
	t.Helper()
	want = slices.Clone(want)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("span tree differs\n got:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func findSpans(spans []Span, name string) []Span {
	var out []Span
	for _, sp := range spans {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func mustAttr(t testing.TB, sp Span, key string, want any) {
	t.Helper()
	v, ok := attr(sp, key)
	if !ok {
		t.Errorf("%s: attribute %s missing", desc(sp), key)
		return
	}
	if fmt.Sprint(v.v) != fmt.Sprint(want) {
		t.Errorf("%s: %s = %v, want %v", desc(sp), key, v.v, want)
	}
}

func noAttr(t testing.TB, sp Span, key string) {
	t.Helper()
	if v, ok := attr(sp, key); ok {
		t.Errorf("%s: unexpected attribute %s = %v", desc(sp), key, v.v)
	}
}

// withStream gives the request the TCP stream position both ends' kernels
// read for it (loader.HTTPEvent StreamSeq).
func withStream(pos uint32) reqOpt {
	return func(ev *loader.HTTPEvent) { ev.StreamSeq, ev.StreamOk = pos, 1 }
}
