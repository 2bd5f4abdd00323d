//go:build linux

package inject

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/test/testproc"
)

const python = "/usr/bin/python3" // Debian's, with fastapi, uvicorn and aiohttp

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds gymtrace and the OTLP sink (its own module) once.
func binaries(t testing.TB) (gymtrace, sink string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gymtrace-inject-bin-")
		if buildErr != nil {
			return
		}
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		for _, j := range []struct{ dir, out, pkg string }{
			{root, filepath.Join(binDir, "gymtrace"), "./cmd/gymtrace"},
			{filepath.Join(root, "test", "otlpsink"), filepath.Join(binDir, "otlpsink"), "."},
		} {
			cmd := exec.Command("go", "build", "-o", j.out, j.pkg)
			cmd.Dir = j.dir
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", j.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "gymtrace"), filepath.Join(binDir, "otlpsink")
}

func needStack(t testing.TB) {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2 (ip netns) to make two network namespaces")
	}
	if err := exec.Command(python, "-c", "import fastapi, uvicorn, aiohttp").Run(); err != nil {
		t.Skip("needs Debian's python3-fastapi, python3-uvicorn and python3-aiohttp under /usr/bin/python3")
	}
}

func run(t testing.TB, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// nodes makes two network namespaces joined by a veth pair: 192.0.2.1 in the
// first, 192.0.2.2 in the second (TEST-NET-1, only ever on this veth).
func nodes(t testing.TB) (a, b string) {
	t.Helper()
	tag := strconv.Itoa(os.Getpid() % 100000)
	a, b = "gtinjA"+tag, "gtinjB"+tag
	va, vb := "gtA"+tag, "gtB"+tag
	run(t, "ip", "netns", "add", a)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", a).Run() })
	run(t, "ip", "netns", "add", b)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", b).Run() })
	run(t, "ip", "link", "add", va, "type", "veth", "peer", "name", vb)
	run(t, "ip", "link", "set", va, "netns", a)
	run(t, "ip", "link", "set", vb, "netns", b)
	run(t, "ip", "-n", a, "addr", "add", "192.0.2.1/24", "dev", va)
	run(t, "ip", "-n", b, "addr", "add", "192.0.2.2/24", "dev", vb)
	for _, ns := range []string{a, b} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", a, "link", "set", va, "up")
	run(t, "ip", "-n", b, "link", "set", vb, "up")
	return a, b
}

type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
}

type syncBuf = testproc.Buffer

func start(t testing.TB, name string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(argv[0], argv[1:]...), out: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop(5 * time.Second) })
	return p
}

func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) waitFor(t testing.TB, substr string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.out.String(), substr) {
		select {
		case <-p.done:
			t.Fatalf("%s exited before printing %q:\n%s", p.name, substr, tail(p.out.String()))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q in %v:\n%s", p.name, substr, d, tail(p.out.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

var freePort = testproc.FreePort

// topology says which namespace runs what, and which gymtrace traces what.
type topology struct {
	agentNS, modelNS string // the collector runs with the agent
	agentIP, modelIP string
	oneTracer        bool // one gymtrace for all four processes
	inject           bool
	untracedClient   bool // the collector is not traced: /run arrives without traceparent
	// Gym's runtime: "uvloop" with "httptools"; "" is the default loop, h11.
	loop, http string
	n, c       int // rollouts and their concurrency; 0: rollouts and 4
}

func (top topology) rollouts() int {
	if top.n == 0 {
		return rollouts
	}
	return top.n
}

type result struct {
	sockOps []int // per gymtrace: its sock_ops programs attached to the cgroup v2 root
	spans   []sinkSpan
	metrics []map[string]float64 // per gymtrace
	pids    map[string]int
}

type sinkSpan struct {
	Name     string         `json:"name"`
	Kind     string         `json:"kind"`
	TraceID  string         `json:"trace_id"`
	SpanID   string         `json:"span_id"`
	Parent   string         `json:"parent_span_id"`
	Attrs    map[string]any `json:"attributes"`
	Resource map[string]any `json:"resource"`
}

func (s sinkSpan) pid() int {
	f, _ := s.Resource["process.pid"].(float64)
	return int(f)
}

const rollouts = 12

// runStack starts the Gym-shaped stack on the topology, one or two
// gymtraces exporting to one OTLP sink, runs the collector and returns what
// the sink received.
func runStack(t *testing.T, top topology) result {
	t.Helper()
	gymtrace, sinkBin := binaries(t)
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	stack := filepath.Join(root, "test", "stack")
	dir := t.TempDir()

	sinkOut := filepath.Join(dir, "spans.jsonl")
	sink := start(t, "otlpsink", nil, sinkBin, "--out", sinkOut, "--listen", "127.0.0.1:0")
	sink.waitFor(t, "listening ", 30*time.Second)
	var sinkAddr string
	for _, l := range strings.Split(sink.out.String(), "\n") {
		if strings.HasPrefix(l, "listening ") {
			sinkAddr = strings.TrimSpace(strings.TrimPrefix(l, "listening "))
		}
	}

	// Gym's own config: every server learns its peers' addresses from it.
	ports := map[string]int{"agent": 12001, "model": 12002, "resources": 12003}
	cfg := map[string]any{
		"simple_weather": map[string]any{"resources_servers": map[string]any{"simple_weather": map[string]any{
			"entrypoint": "resources.py", "host": top.modelIP, "port": ports["resources"]}}},
		"policy_model": map[string]any{"responses_api_models": map[string]any{"openai_model": map[string]any{
			"entrypoint": "model.py", "host": top.modelIP, "port": ports["model"]}}},
		"simple_weather_simple_agent": map[string]any{"responses_api_agents": map[string]any{"simple_agent": map[string]any{
			"entrypoint": "agent.py", "host": top.agentIP, "port": ports["agent"],
			"resources_server": map[string]any{"type": "resources_servers", "name": "simple_weather"},
			"model_server":     map[string]any{"type": "responses_api_models", "name": "policy_model"}}}},
	}
	cfgJSON, _ := json.Marshal(cfg)
	servers := []struct{ kind, name, entry, ns, ip string }{
		{"resources", "simple_weather", "resources.py", top.modelNS, top.modelIP},
		{"model", "policy_model", "model.py", top.modelNS, top.modelIP},
		{"agent", "simple_weather_simple_agent", "agent.py", top.agentNS, top.agentIP},
	}
	res := result{pids: map[string]int{}}
	var procs []*proc
	defer func() {
		// The next topology reuses the namespaces and ports.
		for _, p := range procs {
			p.stop(5 * time.Second)
		}
	}()
	var loopArgs []string
	if top.loop != "" {
		loopArgs = append(loopArgs, "--loop", top.loop)
	}
	if top.http != "" {
		loopArgs = append(loopArgs, "--http", top.http)
	}
	for _, s := range servers {
		p := start(t, s.kind, []string{"NEMO_GYM_CONFIG_DICT=" + string(cfgJSON), "NEMO_GYM_CONFIG_PATH=" + s.name},
			append([]string{"ip", "netns", "exec", s.ns, python, filepath.Join(stack, s.entry)}, loopArgs...)...)
		procs = append(procs, p)
		res.pids[s.kind] = p.cmd.Process.Pid // ip netns exec execs the command: same pid
		url := fmt.Sprintf("http://%s:%d/", s.ip, ports[s.kind])
		deadline := time.Now().Add(30 * time.Second)
		for exec.Command("ip", "netns", "exec", s.ns, python, "-c",
			"import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)", url).Run() != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not answer on %s:\n%s", s.kind, url, tail(p.out.String()))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The collector stops itself before it exec's, so it can be a target
	// before its first connect().
	coll := start(t, "collector", nil, "ip", "netns", "exec", top.agentNS, "sh", "-c",
		`kill -STOP $$; exec "$@"`, "sh", filepath.Join(stack, "bin", "ng_collect_rollouts"),
		"--agent-url", fmt.Sprintf("http://%s:%d", top.agentIP, ports["agent"]),
		"--rollouts", strconv.Itoa(top.rollouts()), "--concurrency", strconv.Itoa(max(top.c, 4)))
	procs = append(procs, coll)
	res.pids["collector"] = coll.cmd.Process.Pid
	waitStopped(t, res.pids["collector"])

	groups := [][]string{{"agent=agent", "collector=orchestrator"}, {"model=model", "resources=resources"}}
	if top.untracedClient {
		groups[0] = groups[0][:1]
	}
	if top.oneTracer {
		groups = [][]string{{"agent=agent", "collector=orchestrator", "model=model", "resources=resources"}}
	}
	var tracers []*proc
	var metricsAddrs []string
	for i, g := range groups {
		var pidFlags []string
		for _, kr := range g {
			k, role, _ := strings.Cut(kr, "=")
			pidFlags = append(pidFlags, "--pid", fmt.Sprintf("%d=%s", res.pids[k], role))
		}
		maddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		metricsAddrs = append(metricsAddrs, maddr)
		argv := append([]string{gymtrace, "run", "--otlp-endpoint", "http://" + sinkAddr, "--metrics-addr", maddr,
			"--span-groups", "default", "--inject=" + strconv.FormatBool(top.inject)}, pidFlags...)
		if top.inject {
			// These tests measure the injection mechanism: on a kernel whose
			// sockhash misreports FIONREAD gymtrace keeps injection off by
			// default (test/conformance checks that), so it is forced here.
			argv = append(argv, "--inject-force")
		}
		g := start(t, fmt.Sprintf("gymtrace-%d", i), nil, argv...)
		g.waitFor(t, "gymtrace: attached", 60*time.Second)
		tracers = append(tracers, g)
	}
	attached := cgroupSockOps(t)
	for _, g := range tracers {
		n := 0
		for _, id := range sockOpsOf(t, g.cmd.Process.Pid) {
			if attached[id] {
				n++
			}
		}
		res.sockOps = append(res.sockOps, n)
	}
	syscall.Kill(res.pids["collector"], syscall.SIGCONT)
	select {
	case <-coll.done:
	case <-time.After(120 * time.Second):
		t.Fatalf("the collector did not finish:\n%s", tail(coll.out.String()))
	}
	if coll.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("the collector failed:\n%s", tail(coll.out.String()))
	}
	time.Sleep(1500 * time.Millisecond) // last responses reach the ring buffers
	for _, a := range metricsAddrs {
		res.metrics = append(res.metrics, scrape(t, a))
	}
	for _, g := range tracers {
		g.stop(15 * time.Second)
		if !strings.Contains(g.out.String(), "gymtrace: detached") {
			t.Errorf("%s did not shut down cleanly:\n%s", g.name, tail(g.out.String()))
		}
	}
	sink.stop(5 * time.Second)
	f, err := os.Open(sinkOut)
	if err != nil {
		t.Fatalf("reading the sink's spans: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var s sinkSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("sink line %q: %v", sc.Text(), err)
		}
		res.spans = append(res.spans, s)
	}
	return res
}

// cgroupSockOps returns the ids of the sock_ops programs attached to the
// cgroup v2 root (other gymtraces on this host may hold some).
func cgroupSockOps(t testing.TB) map[uint32]bool {
	t.Helper()
	cg, err := preflight.CgroupV2Path()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		t.Fatalf("querying the cgroup's sock_ops programs: %v", err)
	}
	out := map[uint32]bool{}
	for _, p := range q.Programs {
		out[uint32(p.ID)] = true
	}
	return out
}

// sockOpsOf returns the ids of the sock_ops programs process pid holds
// (from its fds' fdinfo: prog_type 13 is BPF_PROG_TYPE_SOCK_OPS).
func sockOpsOf(t testing.TB, pid int) []uint32 {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	var out []uint32
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var typ, id string
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			switch k {
			case "prog_type":
				typ = strings.TrimSpace(v)
			case "prog_id":
				id = strings.TrimSpace(v)
			}
		}
		if typ == "13" {
			if n, err := strconv.Atoi(id); err == nil {
				out = append(out, uint32(n))
			}
		}
	}
	return out
}

func waitStopped(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "T" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d did not stop itself", pid)
}

func scrape(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

// joins measures how the model and resources servers' spans join the
// agent's calls, through parent links in the spans the sink received.
type joins struct {
	runs         int // the agent's /run SERVER spans (one per rollout)
	remoteServer int // SERVER spans of model/resources
	joined       int // ... whose parent is an agent CLIENT span of the same trace
	underRun     int // ... whose ancestors reach an agent /run SERVER span
	complete     int // /run spans with all 7 model/resources SERVER spans of a rollout below them
	underJob     int // /run spans whose ancestors reach the collector's gym.job
}

func measure(r result) joins {
	byID := map[string]sinkSpan{}
	for _, s := range r.spans {
		byID[s.TraceID+s.SpanID] = s
	}
	// ancestor walks up to 64 parents within the trace.
	ancestor := func(s sinkSpan, match func(sinkSpan) bool) (sinkSpan, bool) {
		for i := 0; i < 64 && s.Parent != ""; i++ {
			p, ok := byID[s.TraceID+s.Parent]
			if !ok {
				return sinkSpan{}, false
			}
			if match(p) {
				return p, true
			}
			s = p
		}
		return sinkSpan{}, false
	}
	isRun := func(s sinkSpan) bool {
		return s.Kind == "SERVER" && s.pid() == r.pids["agent"] && s.Name == "POST /run"
	}
	var j joins
	perRun := map[string]int{}
	for _, s := range r.spans {
		if isRun(s) {
			j.runs++
			if _, ok := ancestor(s, func(p sinkSpan) bool { return p.Name == "gym.job" && p.pid() == r.pids["collector"] }); ok {
				j.underJob++
			}
		}
		if s.Kind != "SERVER" || (s.pid() != r.pids["model"] && s.pid() != r.pids["resources"]) {
			continue
		}
		j.remoteServer++
		if p, ok := byID[s.TraceID+s.Parent]; ok && p.Kind == "CLIENT" && p.pid() == r.pids["agent"] {
			j.joined++
		}
		if run, ok := ancestor(s, isRun); ok {
			j.underRun++
			perRun[run.SpanID]++
		}
	}
	for _, n := range perRun {
		if n == 7 {
			j.complete++
		}
	}
	return j
}

func metric(m map[string]float64, name string) float64 {
	return m[`gymtrace_kernel_events_total{reason="`+name+`"}`]
}

// TestTwoNodes: agent + collector on one "node", model + resources on the
// other, one gymtrace each, one OTLP receiver: the model's and resources'
// spans must hang under the agent's calls exactly as when one gymtrace sees
// the whole stack on one node. With injection off, they must not (Gym's
// "disconnected traces").
func TestTwoNodes(t *testing.T) {
	needStack(t)
	a, b := nodes(t)

	two := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true})
	jt := measure(two)
	t.Logf("two nodes, injection on: %+v", jt)
	for i, m := range two.metrics {
		t.Logf("  gymtrace %d: sockets=%v prepared=%v injected=%v miss=%v not_pushed=%v push_fail=%v unattributed=%v",
			i, metric(m, "inject_sockets"), metric(m, "inject_prepared"), metric(m, "inject_injected"),
			metric(m, "inject_miss"), metric(m, "inject_not_pushed"), metric(m, "inject_push_fail"), metric(m, "inject_unattributed"))
	}

	one := runStack(t, topology{agentNS: a, modelNS: a, agentIP: "192.0.2.1", modelIP: "192.0.2.1", oneTracer: true, inject: true})
	jo := measure(one)
	t.Logf("one node, one gymtrace:  %+v", jo)

	off := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: false})
	jf := measure(off)
	t.Logf("two nodes, injection off: %+v", jf)

	// The agent's /run arrives without traceparent: its trace is the one
	// userspace decides, published when it reads the request; the handler's
	// calls race that (inject_miss when they win).
	bare := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true, untracedClient: true})
	jb := measure(bare)
	m := bare.metrics[0]
	t.Logf("two nodes, untraced collector: %+v; agent's gymtrace: injected=%v miss=%v", jb, metric(m, "inject_injected"), metric(m, "inject_miss"))
	if jb.remoteServer != 7*rollouts || jb.joined < jb.remoteServer*9/10 {
		t.Errorf("untraced collector: %d of %d remote SERVER spans joined; want at least 90%%", jb.joined, jb.remoteServer)
	}

	if jt.remoteServer != 7*rollouts {
		t.Errorf("two nodes: %d model/resources SERVER spans, want %d", jt.remoteServer, 7*rollouts)
	}
	if jt.joined != jt.remoteServer || jt.underRun != jt.remoteServer || jt.runs != rollouts || jt.complete != rollouts {
		t.Errorf("two nodes: %d of %d remote SERVER spans joined (%d under their /run), %d of %d rollouts complete",
			jt.joined, jt.remoteServer, jt.underRun, jt.complete, jt.runs)
	}
	if jt.joined < jo.joined || jt.complete < jo.complete || jt.underJob < jo.underJob {
		t.Errorf("two nodes join worse than one: %+v vs %+v", jt, jo)
	}
	if jf.joined != 0 {
		t.Errorf("injection off: %d remote SERVER spans joined across nodes; want 0 (disconnected traces)", jf.joined)
	}
	// Two instances side by side: one cgroup attachment each, and neither
	// disturbs the other (the model/resources side makes no outbound call,
	// so only the agent's instance has sockets to inject into).
	if fmt.Sprint(two.sockOps) != "[1 1]" || fmt.Sprint(off.sockOps) != "[0 0]" {
		t.Errorf("own sock_ops programs attached to the cgroup root, per gymtrace: %v injecting (want [1 1]), %v with --inject=false (want [0 0])",
			two.sockOps, off.sockOps)
	}
	for i, m := range two.metrics {
		if metric(m, "inject_push_fail") != 0 || metric(m, "inject_socket_fail") != 0 {
			t.Errorf("gymtrace %d: push_fail=%v socket_fail=%v", i, metric(m, "inject_push_fail"), metric(m, "inject_socket_fail"))
		}
	}
	if metric(two.metrics[0], "inject_sockets") == 0 {
		t.Errorf("the agent's gymtrace put no socket in its sockhash")
	}
	if metric(two.metrics[0], "inject_injected") == 0 {
		t.Errorf("the agent's gymtrace injected nothing")
	}
}

// TestTwoNodesUVloop: the same two nodes on Gym's runtime (uvloop and
// httptools on every server) at concurrency 64: the traceparent the agent's
// gymtrace injects must name the right parent although uvloop flushes the
// agent's writes outside the task that made them (bpf/python_uvloop.h), so
// every rollout is one trace across both gymtraces.
func TestTwoNodesUVloop(t *testing.T) {
	needStack(t)
	a, b := nodes(t)
	const n = 64
	r := runStack(t, topology{agentNS: a, modelNS: b, agentIP: "192.0.2.1", modelIP: "192.0.2.2", inject: true,
		loop: "uvloop", http: "httptools", n: n, c: 64})
	j := measure(r)
	m := r.metrics[0]
	t.Logf("two nodes, uvloop+httptools, c=64: %+v; agent's gymtrace: injected=%v miss=%v unattributed=%v",
		j, metric(m, "inject_injected"), metric(m, "inject_miss"), metric(m, "inject_unattributed"))
	if j.remoteServer != 7*n {
		t.Errorf("%d model/resources SERVER spans, want %d", j.remoteServer, 7*n)
	}
	if j.joined != j.remoteServer || j.underRun != j.remoteServer || j.runs != n || j.complete != n {
		t.Errorf("%d of %d remote SERVER spans joined (%d under their /run), %d of %d rollouts complete",
			j.joined, j.remoteServer, j.underRun, j.complete, j.runs)
	}
}
