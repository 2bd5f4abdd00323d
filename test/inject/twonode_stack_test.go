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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/preflight"
	"github.com/gymtrace/gymtrace/test/testproc"
)

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
	// The agent's outbound connections: "" one keep-alive pool (Gym's),
	// "per-rollout" a pool per rollout, so every rollout connects anew.
	connections string
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
	// What GYMTRACE_TWONODE_KEEP keeps: the sink's file, each process's output.
	sinkFile string
	logs     map[string]string
	pids     map[string]int
}

type sinkSpan struct {
	Name     string         `json:"name"`
	Kind     string         `json:"kind"`
	TraceID  string         `json:"trace_id"`
	SpanID   string         `json:"span_id"`
	Parent   string         `json:"parent_span_id"`
	Start    uint64         `json:"start_time_unix_nano"`
	Attrs    map[string]any `json:"attributes"`
	Resource map[string]any `json:"resource"`
}

func (s sinkSpan) pid() int {
	f, _ := s.Resource["process.pid"].(float64)
	return int(f)
}

const rollouts = 12

// injectDecided: GYMTRACE_TEST_INJECT_ON=1, injection is on here as gymtrace
// decides it (its start-up self-test passes), so nothing is forced and the
// tests check that it is on.
func injectDecided() bool { return os.Getenv("GYMTRACE_TEST_INJECT_ON") == "1" }

// runStack starts the Gym-shaped stack on the topology, one or two
// gymtraces exporting to one OTLP sink, runs the collector and returns what
// the sink received.
func runStack(t *testing.T, top topology) result {
	t.Helper()
	gymtrace, sinkBin := binaries(t)
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	stack := filepath.Join(root, "test", "stack")
	dir := t.TempDir()
	t0 := time.Now()
	// Where the time goes (under QEMU's TCG, minutes).
	stage := func(what string) { t.Logf("%s: %s after the start", what, time.Since(t0).Round(100*time.Millisecond)) }

	sinkOut := filepath.Join(dir, "spans.jsonl")
	sink := start(t, "otlpsink", nil, sinkBin, "--out", sinkOut, "--listen", "127.0.0.1:0")
	sink.waitFor(t, "listening ", testproc.Slow(30*time.Second))
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
	res := result{pids: map[string]int{}, sinkFile: sinkOut, logs: map[string]string{}}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			res.logs[p.name] = p.out.String()
		}
		// The next topology reuses the namespaces and ports.
		for _, p := range procs {
			p.stop(testproc.Slow(5 * time.Second))
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
		args := loopArgs
		if s.kind == "agent" && top.connections != "" {
			args = append(slices.Clip(args), "--connections", top.connections)
		}
		p := start(t, s.kind, []string{"NEMO_GYM_CONFIG_DICT=" + string(cfgJSON), "NEMO_GYM_CONFIG_PATH=" + s.name},
			append([]string{"ip", "netns", "exec", s.ns, python, filepath.Join(stack, s.entry)}, args...)...)
		procs = append(procs, p)
		res.pids[s.kind] = p.cmd.Process.Pid // ip netns exec execs the command: same pid
		url := fmt.Sprintf("http://%s:%d/", s.ip, ports[s.kind])
		deadline := time.Now().Add(testproc.Slow(30 * time.Second))
		for exec.Command("ip", "netns", "exec", s.ns, python, "-c",
			"import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)", url).Run() != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not answer on %s:\n%s", s.kind, url, tail(p.out.String()))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	stage("servers up")
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
		if top.inject && !injectDecided() {
			// These tests measure the injection mechanism: on a kernel whose
			// sockhash misreports FIONREAD gymtrace keeps injection off by
			// default (test/conformance checks that), so it is forced here,
			// unless GYMTRACE_TEST_INJECT_ON=1 says this kernel's self-test
			// passes (Debian's kernels in scripts/kernel-matrix's guests).
			argv = append(argv, "--inject-force")
		}
		g := start(t, fmt.Sprintf("gymtrace-%d", i), nil, argv...)
		g.waitFor(t, "gymtrace: attached", testproc.Slow(60*time.Second))
		tracers = append(tracers, g)
	}
	stage("gymtraces attached")
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
	// GYMTRACE_TWONODE_STRACE=DIR: the agent's socket reads and writes
	// during the collection, in DIR/strace.agent (what a failure's bytes
	// were, and how they were read).
	if dir := os.Getenv("GYMTRACE_TWONODE_STRACE"); dir != "" {
		os.MkdirAll(dir, 0o755)
		st := start(t, "strace", nil, "strace", "-f", "-ttt", "-xx", "-s", "256", "-e",
			"trace=read,write,readv,writev,recvfrom,sendto,recvmsg,sendmsg,accept4,connect,close",
			"-p", strconv.Itoa(res.pids["agent"]), "-o", filepath.Join(dir, "strace.agent"))
		procs = append(procs, st)
		time.Sleep(testproc.Slow(2 * time.Second)) // attached
	}
	syscall.Kill(res.pids["collector"], syscall.SIGCONT)
	select {
	case <-coll.done:
	case <-time.After(testproc.Slow(120 * time.Second)):
		t.Fatalf("the collector did not finish:\n%s", tail(coll.out.String()))
	}
	if coll.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("the collector failed:\n%s", tail(coll.out.String()))
	}
	stage("collection done")
	time.Sleep(testproc.Slow(1500 * time.Millisecond)) // last responses reach the ring buffers
	for _, a := range metricsAddrs {
		res.metrics = append(res.metrics, scrape(t, a))
	}
	for _, g := range tracers {
		g.stop(testproc.Slow(15 * time.Second))
		res.logs[g.name] = g.out.String()
		if !strings.Contains(g.out.String(), "gymtrace: detached") {
			t.Errorf("%s did not shut down cleanly:\n%s", g.name, tail(g.out.String()))
		}
	}
	sink.stop(testproc.Slow(5 * time.Second))
	stage("gymtraces and sink stopped")
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
	deadline := time.Now().Add(testproc.Slow(10 * time.Second))
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
