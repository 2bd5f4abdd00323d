//go:build linux

package e2e

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// --- the Gym-shaped stack (test/stack) ----------------------------------------

type stackServer struct {
	Name string `json:"name"`
	Type string `json:"type"`
	PID  int    `json:"pid"`
	Host string `json:"host"`
	Port int    `json:"port"`
	URL  string `json:"url"`
}

type stackReady struct {
	Event         string                 `json:"event"`
	Error         string                 `json:"error"`
	Host          string                 `json:"host"`
	LogDir        string                 `json:"log_dir"`
	Servers       map[string]stackServer `json:"servers"`
	CollectorArgv []string               `json:"collector_argv"`
}

type stack struct {
	*proc
	ready stackReady
}

// startStack runs launch.py --serve --warmup 2: the servers are up and their
// pooled keep-alive connections exist before any gymtrace attaches.
func startStack(t testing.TB, own owner, args ...string) *stack {
	t.Helper()
	argv := append([]string{python, filepath.Join(repoRoot, "test", "stack", "launch.py"), "--serve", "--warmup", "2"}, args...)
	s := &stack{proc: startProc(t, own, "stack", argv, procOpts{Dir: repoRoot})}
	line := s.FirstLine(t, 120*time.Second)
	if err := json.Unmarshal([]byte(line), &s.ready); err != nil {
		t.Fatalf("launch.py's first line is not JSON: %v: %s", err, line)
	}
	if s.ready.Event != "ready" {
		t.Fatalf("the stack did not start: %s; stderr:\n%s", line, tail(s.Stderr.String(), 4096))
	}
	for _, k := range []string{"agent", "model", "resources"} {
		if s.ready.Servers[k].PID == 0 {
			t.Fatalf("launch.py's ready line has no %s server: %s", k, line)
		}
	}
	return s
}

var shared struct {
	once sync.Once
	st   *stack
}

// sharedStack is one IPv4 stack for every test that only needs traffic: each
// test attaches its own gymtrace to it, so the stack's connections always
// predate the tracer, as in production.
func sharedStack(t *testing.T) *stack {
	t.Helper()
	needStack(t)
	shared.once.Do(func() { shared.st = startStack(t, sharedOwner{}) })
	if shared.st == nil {
		t.Fatal("the shared stack failed to start (see the first test that used it)")
	}
	if shared.st.Exited() {
		t.Fatalf("the shared stack died: %v; stderr:\n%s", shared.st.Err, tail(shared.st.Stderr.String(), 4096))
	}
	return shared.st
}

func (s *stack) server(role string) stackServer { return s.ready.Servers[role] }

func (s *stack) pids() []int {
	return []int{s.server("agent").PID, s.server("model").PID, s.server("resources").PID}
}

type summary struct {
	Event      string   `json:"event"`
	Rollouts   int      `json:"rollouts"`
	OK         int      `json:"ok"`
	Failed     int      `json:"failed"`
	RewardMean float64  `json:"reward_mean"`
	RolloutIDs []string `json:"rollout_ids"`
	Errors     []any    `json:"errors"`
}

// collect runs one collection (collector_argv + --rollouts n --concurrency c
// + extra) against the running stack. The collector is not traced.
func (s *stack) collect(t testing.TB, n, c int, wantOK bool, extra ...string) summary {
	t.Helper()
	argv := append(append([]string{}, s.ready.CollectorArgv...), "--rollouts", strconv.Itoa(n), "--concurrency", strconv.Itoa(c))
	argv = append(argv, extra...)
	ctx, cancel := withTimeout(120 * time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = repoRoot
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr syncBuf
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var sum summary
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"summary"`) {
			if jerr := json.Unmarshal([]byte(line), &sum); jerr != nil {
				t.Fatalf("collector summary is not JSON: %v: %s", jerr, line)
			}
		}
	}
	if sum.Event != "summary" {
		t.Fatalf("collector %v printed no summary (%v); stdout:\n%s\nstderr:\n%s", argv, err, out, tail(stderr.String(), 4096))
	}
	if wantOK && (err != nil || sum.OK != n) {
		t.Fatalf("collector: %d of %d rollouts ok (%v), errors %v; stderr:\n%s", sum.OK, n, err, sum.Errors, tail(stderr.String(), 4096))
	}
	return sum
}

// --- what one rollout does -------------------------------------------------------

// One rollout at the stack's defaults (--turns 2, model route responses, no
// prefix), by process: the agent serves /run and its own /v1/responses and
// makes 8 calls (seed_session, self /v1/responses, 2 x (model, get_weather),
// gather(verify, get_weather)); the model serves 2 calls; resources 5.
type stackCall struct {
	role   string   // process: agent, model, resources
	server bool     // the process serves it (else the process makes the call)
	name   string   // SERVER span name, or "HTTP POST"
	gym    string   // gym.* span under the SERVER span, "" when none
	groups []string // the kernel's group bits for this message
	n      int      // per rollout
}

var rolloutCalls = []stackCall{
	{"agent", true, "POST /run", "gym.rollout", []string{"server", "rollout"}, 1},
	{"agent", true, "POST /v1/responses", "gym.agent.responses", []string{"server", "agent"}, 1},
	{"agent", false, "HTTP POST", "", []string{"http_client"}, 8},
	{"model", true, "POST /v1/responses", "gym.model.responses", []string{"server", "model_call"}, 2},
	{"resources", true, "POST /seed_session", "", []string{"server"}, 1},
	{"resources", true, "POST /get_weather", "", []string{"server"}, 3},
	{"resources", true, "POST /verify", "gym.verify", []string{"server", "verify"}, 1},
}

// The gate's first test per process and direction (groups.ServerPossible and
// ClientPossible): when none of these is enabled, the kernel returns before it
// counts anything.
var serverPossible = map[string][]string{
	"agent":     {"server", "rollout", "agent"},
	"model":     {"server", "model_call"},
	"resources": {"server", "verify"},
}

var gymGroup = map[string]string{
	"gym.rollout": "rollout", "gym.agent.responses": "agent", "gym.model.responses": "model_call", "gym.verify": "verify",
}

type groupSet map[string]bool

func newGroupSet(names ...string) groupSet {
	g := groupSet{}
	for _, n := range names {
		g[n] = true
	}
	return g
}

func (g groupSet) any(names []string) bool {
	for _, n := range names {
		if g[n] {
			return true
		}
	}
	return false
}

// allGroups are the groups the metrics report.
var allGroups = []string{"job", "server", "http_client", "rollout", "agent", "model_call", "verify", "sandbox", "checkpoint", "step", "optimizer"}

// expectedCounters is what the kernel must count for n rollouts: at each
// request start, every group bit of the message is counted as emitted when
// enabled and discarded when not, unless the process/direction gate returned
// first (no enabled group possible there: nothing read, nothing counted).
func expectedCounters(enabled groupSet, n int) (emitted, discarded map[string]float64) {
	emitted, discarded = map[string]float64{}, map[string]float64{}
	for _, g := range allGroups {
		emitted[g], discarded[g] = 0, 0
	}
	for _, c := range rolloutCalls {
		possible := []string{"http_client"}
		if c.server {
			possible = serverPossible[c.role]
		}
		if !enabled.any(possible) {
			continue
		}
		for _, g := range c.groups {
			if enabled[g] {
				emitted[g] += float64(c.n * n)
			} else {
				discarded[g] += float64(c.n * n)
			}
		}
	}
	return emitted, discarded
}

func expectedSpanCount(enabled groupSet, n int) int {
	total := 0
	for _, c := range rolloutCalls {
		if c.server && enabled["server"] || !c.server && enabled["http_client"] {
			total += c.n * n
		}
		if c.gym != "" && enabled[gymGroup[c.gym]] {
			total += c.n * n
		}
	}
	return total
}

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
		t.Errorf("ring-buffer reservation failures: %v", v)
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

// --- tests ------------------------------------------------------------------------

// TestSelections traces the running stack under each span-group selection of
// the spec and checks the spans against Gym's, and the kernel's per-group
// counters against the gate: a disabled group gets no span and no ring-buffer
// record (emitted stays 0; requests of it are counted as discarded).
func TestSelections(t *testing.T) {
	st := sharedStack(t)
	cases := []struct {
		name, spec string
		enabled    groupSet
	}{
		{"default", "default", newGroupSet("job", "server", "http_client", "rollout")},
		{"per_rollout", "per_rollout", newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")},
		{"server_http_client_verify", "server,http_client,verify", newGroupSet("server", "http_client", "verify")},
		{"verify_alone", "verify", newGroupSet("verify")},
		{"everything_off", "", newGroupSet()},
	}
	const n = 3
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := traceStack(t, st, c.spec, c.enabled, n)
			r.checkCounters(t)
			r.checkSpans(t)
			if len(c.enabled) == 0 {
				if len(r.spans.all) != 0 {
					t.Errorf("everything off exported %d spans", len(r.spans.all))
				}
				// The gate returns before reading any user memory.
				if v := r.metrics[`gymtrace_kernel_events_total{reason="skipped_bytes"}`]; v != 0 {
					t.Errorf("everything off: the kernel looked at %v bytes, want 0", v)
				}
			}
			t.Logf("%s: %d spans, emitted %v, discarded %v", c.spec, len(r.spans.all),
				groupCounters(r.metrics, "gymtrace_events_emitted_total"), groupCounters(r.metrics, "gymtrace_events_discarded_total"))
		})
	}
}

// TestAttachToRunningStack_PreexistingKeepAlive is the normal flow made
// explicit: the agent's pooled keep-alive connections to the model and
// resources servers (and to itself) were opened by the warmup, before gymtrace
// started, so no accept or connect is ever seen for them; the next rollouts
// on those very connections must still produce complete, joined traces.
func TestAttachToRunningStack_PreexistingKeepAlive(t *testing.T) {
	st := sharedStack(t)
	// Untraced rollouts first: uvicorn closes connections idle for 30 s, so
	// make sure the agent's pool is fresh, and opened before gymtrace.
	st.collect(t, 2, 2, true)
	agent := st.server("agent").PID
	before := establishedLocalPorts(t, agent)
	if len(before) == 0 {
		t.Fatalf("the agent (pid %d) has no established TCP connection after the warmup", agent)
	}
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 3)
	r.checkCounters(t)
	r.checkSpans(t)
	reused := 0
	for _, s := range r.spans.all {
		if s.Kind == "CLIENT" && before[s.AttrInt("network.local.port")] {
			reused++
			if _, ok := r.spans.byID[s.Parent]; !ok {
				t.Errorf("call on a pre-existing connection has no parent: %v", s)
			}
		}
	}
	if reused == 0 {
		t.Errorf("no CLIENT span on any of the agent's %d pre-existing connections (local ports %v): the test did not exercise attach-to-running",
			len(before), before)
	}
	t.Logf("%d of the agent's calls ran on connections opened before gymtrace attached", reused)
}

// TestStackIPv6 runs the stack on ::1: 4-tuples, addresses and url.full in
// IPv6 form.
func TestStackIPv6(t *testing.T) {
	needStack(t)
	st := startStack(t, t, "--host", "::1")
	r := traceStack(t, st, "default", newGroupSet("job", "server", "http_client", "rollout"), 2)
	r.checkCounters(t)
	r.checkSpans(t)
	for _, s := range r.spans.all {
		if s.Kind == "CLIENT" && !strings.HasPrefix(s.Attr("url.full"), "http://[::1]:") {
			t.Errorf("IPv6 url.full %q", s.Attr("url.full"))
		}
	}
}

// TestStreamingSSE: the model answers "stream": true with text/event-stream
// in chunked encoding (5 events 2 ms apart); the response ends at its last
// chunk, so model spans last at least the stream and the rest of the rollout
// still joins.
func TestStreamingSSE(t *testing.T) {
	st := sharedStack(t)
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 2, "--stream")
	r.checkCounters(t)
	r.checkSpans(t)
	model := st.server("model").PID
	n := 0
	for _, s := range r.spans.all {
		if s.PID() == model && s.Kind == "SERVER" {
			n++
			if s.Duration() < 10*time.Millisecond {
				t.Errorf("streamed model response took %v, want >= 10 ms (5 events 2 ms apart + latency): %v", s.Duration(), s)
			}
		}
	}
	if n == 0 {
		t.Error("no model SERVER span")
	}
}

// TestServerErrors: every 2nd rollout's first model call answers 500, so its
// model /v1/responses, agent /v1/responses and /run answer 500. A 5xx SERVER
// span is ERROR; a CLIENT span that got a 5xx answer is not.
func TestServerErrors(t *testing.T) {
	st := sharedStack(t)
	sk := startSink(t)
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: "per_rollout", otlp: sk.endpoint()})
	sum := st.collect(t, 4, 1, false, "--fail-every", "2")
	if sum.Failed == 0 {
		t.Fatalf("--fail-every 2 failed no rollout: %+v", sum)
	}
	gt.settle(t, 1)
	gt.shutdown(t)
	spans := newSpanSet(readSpans(t, sk.out))
	t.Cleanup(func() {
		if t.Failed() {
			spans.dump(t)
		}
	})
	var s500, c500 int
	for _, s := range spans.all {
		code := s.AttrInt("http.response.status_code")
		switch {
		case s.Kind == "SERVER" && code >= 500:
			s500++
			if s.Status.Code != "ERROR" {
				t.Errorf("5xx SERVER span must be ERROR: %v", s)
			}
		case s.Kind == "SERVER" && s.Status.Code == "ERROR":
			t.Errorf("non-5xx SERVER span is ERROR: %v", s)
		case s.Kind == "CLIENT" && code >= 500:
			c500++
			if s.Status.Code == "ERROR" {
				t.Errorf("a CLIENT span is not ERROR for a 5xx answer: %v", s)
			}
		}
	}
	// Per failed rollout: model, agent /v1/responses and /run answer 500.
	if s500 < 3*sum.Failed || c500 < 2*sum.Failed {
		t.Errorf("%d 5xx SERVER spans and %d 5xx CLIENT spans for %d failed rollouts, want >= %d and >= %d",
			s500, c500, sum.Failed, 3*sum.Failed, 2*sum.Failed)
	}
}

// TestRolloutPrefix: with /ng-rollout/<id>/ on every call, the agent's span is
// named by its route template, model and resources spans by the stripped
// route, the kernel's route table still finds the gym.* groups, and every
// span of a rollout's trace carries that rollout's nemo.gym.rollout.id.
func TestRolloutPrefix(t *testing.T) {
	st := sharedStack(t)
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 3, "--prefix", "all")
	r.checkCounters(t)
	r.checkSpans(t)
	idOfTrace := map[string]string{}
	prefixed := 0
	for _, s := range r.spans.all {
		if _, id := stripRolloutPrefix(s.Path()); id != "" {
			prefixed++
		}
		id := s.Attr("nemo.gym.rollout.id")
		if id == "" {
			continue
		}
		if prev, ok := idOfTrace[s.TraceID]; ok && prev != id {
			t.Errorf("trace %s mixes rollouts %s and %s: %v", s.TraceID, prev, id, s)
		}
		idOfTrace[s.TraceID] = id
	}
	if prefixed == 0 {
		t.Fatal("no span carries a /ng-rollout/<id> path: --prefix all had no effect")
	}
	var ids []string
	for _, id := range idOfTrace {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	want := append([]string{}, r.summary.RolloutIDs...)
	sort.Strings(want)
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Errorf("rollout ids over traces %v, want one trace per rollout %v", ids, want)
	}
}

// establishedLocalPorts lists the local ports of pid's established TCP
// sockets, from /proc/PID/fd and /proc/PID/net/tcp{,6}.
func establishedLocalPorts(t *testing.T, pid int) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	out := map[int]bool{}
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "01" || !inodes[fs[9]] {
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil {
				out[int(p)] = true
			}
		}
		fh.Close()
	}
	return out
}
