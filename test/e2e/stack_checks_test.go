//go:build linux

package e2e

import (
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --- checks ---------------------------------------------------------------------

type stackRun struct {
	st      *stack
	enabled groupSet
	n       int
	spans   *spanSet
	metrics map[string]float64
	summary summary
	// roleOf maps a pid to its role name.
	roleOf map[int]string
}

// traceStack attaches gymtrace (exporting over OTLP/gRPC to the sink) to the
// running stack, runs n rollouts at concurrency 1, scrapes the counters, stops
// gymtrace with SIGTERM and reads what the sink received.
func traceStack(t *testing.T, st *stack, spec string, enabled groupSet, n int, extra ...string) *stackRun {
	t.Helper()
	sk := startSink(t)
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: spec, otlp: sk.endpoint()})
	sum := st.collect(t, n, 1, true, extra...)
	m := gt.settle(t, expectedSpanCount(enabled, n))
	gt.shutdown(t)
	r := &stackRun{st: st, enabled: enabled, n: n, spans: newSpanSet(readSpans(t, sk.out)), metrics: m, summary: sum,
		roleOf: map[int]string{}}
	for _, role := range []string{"agent", "model", "resources"} {
		r.roleOf[st.server(role).PID] = role
	}
	// Every hop forwards Starlette session cookies (base64 JSON, "eyJ..."):
	// no value of theirs may reach the export or the log.
	raw, _ := os.ReadFile(sk.out)
	for what, text := range map[string]string{"the exported spans": string(raw), "gymtrace's log": gt.Stderr.String() + gt.Stdout.String()} {
		if i := strings.Index(text, "eyJ"); i >= 0 {
			t.Errorf("a session cookie value reached %s: ...%s...", what, text[max(0, i-100):min(len(text), i+60)])
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			r.spans.dump(t)
		}
	})
	return r
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// checkCounters compares the kernel's per-group counters with the model.
func (r *stackRun) checkCounters(t *testing.T) {
	t.Helper()
	wantE, wantD := expectedCounters(r.enabled, r.n)
	gotE := groupCounters(r.metrics, "gymtrace_events_emitted_total")
	gotD := groupCounters(r.metrics, "gymtrace_events_discarded_total")
	for _, g := range allGroups {
		if gotE[g] != wantE[g] {
			t.Errorf("gymtrace_events_emitted_total{group=%q} = %v, want %v (enabled: %v)", g, gotE[g], wantE[g], r.enabled)
		}
		if gotD[g] != wantD[g] {
			t.Errorf("gymtrace_events_discarded_total{group=%q} = %v, want %v (enabled: %v)", g, gotD[g], wantD[g], r.enabled)
		}
	}
	if v := r.metrics["gymtrace_ringbuf_reserve_failures_total"]; v != 0 {
		t.Errorf("records lost in the kernel (ring buffer full or crowded): %v", v)
	}
}

// checkSpans checks names, kinds, counts, attributes, resources and parent
// links of every span against what Gym's own telemetry would emit.
func (r *stackRun) checkSpans(t *testing.T) {
	t.Helper()
	host := r.st.ready.Host
	hostname, _ := os.Hostname()
	N := r.n

	// Counts by (process, kind, name).
	want := map[string]int{}
	for _, c := range rolloutCalls {
		if c.server && r.enabled["server"] {
			want[c.role+" SERVER "+c.name] += c.n * N
		}
		if !c.server && r.enabled["http_client"] {
			want[c.role+" CLIENT "+c.name] += c.n * N
		}
		if c.gym != "" && r.enabled[gymGroup[c.gym]] {
			want[c.role+" INTERNAL "+c.gym] += c.n * N
		}
	}
	got := countBy(r.spans.all, func(s Span) string {
		return r.roleOf[s.PID()] + " " + s.Kind + " " + strings.Replace(s.Name, "/ng-rollout/{rollout_id}", "", 1)
	})
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%d spans %q, want %d", got[k], k, v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%d unexpected spans %q", v, k)
		}
	}

	portRole := map[int]string{}
	for _, role := range []string{"agent", "model", "resources"} {
		portRole[r.st.server(role).Port] = role
	}
	traces := map[string][]Span{}
	for _, s := range r.spans.all {
		traces[s.TraceID] = append(traces[s.TraceID], s)
		role := r.roleOf[s.PID()]
		srv := r.st.server(role)
		if role == "" {
			t.Errorf("span from a process that is not a stack server: %v", s)
			continue
		}
		// Resource, as Gym sets it.
		if s.Res("service.name") != "nemo-gym/"+srv.Name || s.Res("nemo.gym.server.type") != srv.Type ||
			s.Res("host.name") != hostname {
			t.Errorf("resource %v of %v: want service.name=nemo-gym/%s nemo.gym.server.type=%s host.name=%s",
				s.Resource, s, srv.Name, srv.Type, hostname)
		}
		if len(s.TraceID) != 32 || len(s.SpanID) != 16 || (s.Parent != "" && len(s.Parent) != 16) {
			t.Errorf("malformed ids: %v", s)
		}
		if _, err := hex.DecodeString(s.TraceID + s.SpanID); err != nil {
			t.Errorf("ids not hex: %v", s)
		}
		if s.Start == 0 || s.End < s.Start || s.Duration() > 30*time.Second {
			t.Errorf("implausible times start=%d end=%d (%v): %v", s.Start, s.End, s.Duration(), s)
		}
		if s.Status.Code == "ERROR" {
			t.Errorf("ERROR status on a successful rollout: %v", s)
		}
		if s.Parent != "" {
			p, ok := r.spans.parent(s)
			if !ok {
				t.Errorf("parent %s of %v was not exported", s.Parent, s)
				continue
			}
			if p.TraceID != s.TraceID {
				t.Errorf("parent %v is in another trace than %v", p, s)
			}
		}
		switch s.Kind {
		case "SERVER":
			r.checkServer(t, s, srv, host)
		case "CLIENT":
			r.checkClient(t, s, host, portRole)
		case "INTERNAL":
			r.checkGym(t, s, srv)
		default:
			t.Errorf("unexpected kind: %v", s)
		}
	}

	// One trace per rollout: the collector is not traced, so each /run (or,
	// with server off, each gym.* span) starts its own trace.
	switch {
	case len(r.spans.all) == 0:
	case r.enabled["server"]:
		if len(traces) != N {
			t.Errorf("%d traces, want one per rollout (%d)", len(traces), N)
		}
		per := len(r.spans.all) / N
		for id, ss := range traces {
			var roots []string
			for _, s := range ss {
				if s.Parent == "" {
					roots = append(roots, s.Name)
				}
			}
			if len(roots) != 1 || roots[0] != "POST /run" || len(ss) != per {
				t.Errorf("trace %s: %d spans with roots %q, want %d spans under one root POST /run", id, len(ss), roots, per)
			}
		}
	default:
		for _, s := range r.spans.all {
			if s.Parent != "" {
				t.Errorf("with server off every span is a root, got %v", s)
			}
		}
		if len(traces) != len(r.spans.all) {
			t.Errorf("%d traces for %d root spans", len(traces), len(r.spans.all))
		}
	}
}

func (r *stackRun) checkServer(t *testing.T, s Span, srv stackServer, host string) {
	t.Helper()
	// With --prefix the path carries /ng-rollout/<id>: the agent's route
	// template keeps it, model and resources strip it before routing.
	full := s.Attr("url.path")
	path, id := stripRolloutPrefix(full)
	route := path
	if id != "" && r.roleOf[s.PID()] == "agent" {
		route = "/ng-rollout/{rollout_id}" + path
	}
	if s.Name != "POST "+route {
		t.Errorf("SERVER span for %s named %q, want %q", full, s.Name, "POST "+route)
	}
	if id != "" && s.Attr("nemo.gym.rollout.id") != id {
		t.Errorf("SERVER span for %s without nemo.gym.rollout.id=%s: %v", full, id, s.Attributes)
	}
	if s.Attr("http.request.method") != "POST" || s.Attr("http.route") != route ||
		s.AttrInt("http.response.status_code") != 200 || s.Attr("server.address") != host ||
		s.AttrInt("server.port") != srv.Port || s.Attr("client.address") != host || s.AttrInt("client.port") <= 0 ||
		s.Attr("nemo.gym.server.name") != srv.Name {
		t.Errorf("SERVER span attributes %v of %v: want method POST, http.route=%s, status 200, server %s:%d, client %s:<port>, nemo.gym.server.name=%s",
			s.Attributes, s, route, host, srv.Port, host, srv.Name)
	}
	if q := s.Attr("url.path"); strings.ContainsAny(q, "?#") {
		t.Errorf("url.path carries a query: %v", s)
	}
	if s.Name == "POST /run" {
		if s.Parent != "" {
			t.Errorf("POST /run must be a root (the collector is not traced): %v", s)
		}
		return
	}
	if !r.enabled["http_client"] {
		if s.Parent != "" {
			t.Errorf("with http_client off a server span has no parent: %v", s)
		}
		return
	}
	// The parent is the CLIENT span of the agent's call on the same connection.
	p, ok := r.spans.parent(s)
	if !ok {
		t.Errorf("server span without its client parent: %v", s)
		return
	}
	agent := r.st.server("agent").PID
	if p.Kind != "CLIENT" || p.PID() != agent || p.AttrInt("server.port") != srv.Port ||
		p.AttrInt("network.local.port") != s.AttrInt("client.port") || p.Path() != full {
		t.Errorf("server span %v: parent %v is not the agent's call on the same connection (want CLIENT from pid %d to port %d from port %d, path %s)",
			s, p, agent, srv.Port, s.AttrInt("client.port"), path)
	}
	within(t, s, p, "server span inside its client span")
}

func (r *stackRun) checkClient(t *testing.T, s Span, host string, portRole map[int]string) {
	t.Helper()
	port := s.AttrInt("server.port")
	target := portRole[port]
	path, _ := stripRolloutPrefix(s.Path())
	wantURL := "http://" + hostPort(host, port) + s.Path()
	if s.Name != "HTTP POST" || s.Attr("http.request.method") != "POST" || s.Attr("url.full") != wantURL ||
		s.Attr("server.address") != host || target == "" || s.AttrInt("http.response.status_code") != 200 ||
		s.AttrInt("network.local.port") <= 0 {
		t.Errorf("CLIENT span attributes %v of %v: want HTTP POST, url.full %s, server.address %s, a stack port, status 200",
			s.Attributes, s, wantURL, host)
	}
	// The innermost enabled span of the handler that made the call.
	fromRun := [2]string{"gym.rollout", "POST /run"}
	fromResponses := [2]string{"gym.agent.responses", "POST /v1/responses"}
	var callers [][2]string
	switch {
	case path == "/get_weather":
		callers = [][2]string{fromRun, fromResponses}
	case target == "model":
		callers = [][2]string{fromResponses}
	default: // seed_session, verify, the agent's own /v1/responses
		callers = [][2]string{fromRun}
	}
	var want []string
	for _, c := range callers {
		switch {
		case r.enabled[gymGroup[c[0]]]:
			want = append(want, c[0])
		case r.enabled["server"]:
			want = append(want, c[1])
		}
	}
	if len(want) == 0 {
		if s.Parent != "" {
			t.Errorf("no enabled span encloses the call, so it must be a root: %v", s)
		}
		return
	}
	p, ok := r.spans.parent(s)
	if !ok || p.PID() != s.PID() || !contains(want, p.Name) {
		t.Errorf("client span %v: parent %v, want one of %q in the agent", s, p, want)
		return
	}
	within(t, s, p, "client span inside its caller")
}

var gymServerName = map[string]string{
	"gym.rollout": "POST /run", "gym.agent.responses": "POST /v1/responses", "gym.model.responses": "POST /v1/responses", "gym.verify": "POST /verify",
}

func (r *stackRun) checkGym(t *testing.T, s Span, srv stackServer) {
	t.Helper()
	if s.Attr("nemo.gym.server.name") != srv.Name {
		t.Errorf("gym span without nemo.gym.server.name=%s: %v %v", srv.Name, s, s.Attributes)
	}
	if !r.enabled["server"] {
		if s.Parent != "" {
			t.Errorf("with server off a gym.* span takes its place as a root: %v", s)
		}
		return
	}
	p, ok := r.spans.parent(s)
	if !ok || p.Kind != "SERVER" || p.PID() != s.PID() || strings.Replace(p.Name, "/ng-rollout/{rollout_id}", "", 1) != gymServerName[s.Name] {
		t.Errorf("gym span %v: parent %v, want its SERVER span %q in the same process", s, p, gymServerName[s.Name])
		return
	}
	within(t, s, p, "gym span inside its server span")
}

// within checks that child's interval lies in parent's. Kernel timestamps of
// one host share a clock; 1 ms covers the monotonic-to-wall conversion.
func within(t *testing.T, child, parent Span, what string) {
	t.Helper()
	const slack = uint64(time.Millisecond)
	if child.Start+slack < parent.Start || child.End > parent.End+slack {
		t.Errorf("%s: [%d, %d] not within [%d, %d]: %v in %v", what, child.Start, child.End, parent.Start, parent.End, child, parent)
	}
}

// stripRolloutPrefix splits "/ng-rollout/<id>/rest" into "/rest" and id.
func stripRolloutPrefix(p string) (string, string) {
	rest, ok := strings.CutPrefix(p, "/ng-rollout/")
	if !ok {
		return p, ""
	}
	id, tail, ok := strings.Cut(rest, "/")
	if !ok {
		return p, ""
	}
	return "/" + tail, id
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
