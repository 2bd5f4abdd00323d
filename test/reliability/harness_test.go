//go:build linux

package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/testproc"
)

// The interpreter with Debian's packages (the python3 on PATH may be a pyenv).
const python = "/usr/bin/python3"

// childEnv makes the test binary run as a helper process instead of tests.
const childEnv = "GT_RELIABILITY_CHILD"

var (
	repoRoot    string
	binDir      string
	gymtraceBin string
	sinkBin     string
	selfBin     string
	buildErr    error
	rootReason  string // why tests skip; "" when they can run
	soak        = os.Getenv("GYMTRACE_SOAK") == "1"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	code := func() int {
		var err error
		repoRoot, err = filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			fmt.Fprintf(os.Stderr, "reliability: finding the repository root: %v\n", err)
			return 1
		}
		if selfBin, err = os.Executable(); err != nil {
			fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
			return 1
		}
		if os.Geteuid() != 0 {
			rootReason = "needs root: gymtrace loads BPF programs and reads other processes' /proc; run `sudo go test ./test/reliability/`"
		} else {
			binDir, err = os.MkdirTemp("", "gymtrace-reliability-bin-")
			if err != nil {
				fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
				return 1
			}
			defer os.RemoveAll(binDir)
			buildErr = buildBinaries()
		}
		return m.Run()
	}()
	os.Exit(code)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// buildBinaries builds gymtrace and the OTLP sink (its own module) in parallel.
func buildBinaries() error {
	gymtraceBin = filepath.Join(binDir, "gymtrace")
	sinkBin = filepath.Join(binDir, "otlpsink")
	jobs := []struct{ dir, out, pkg string }{
		{repoRoot, gymtraceBin, "./cmd/gymtrace"},
		{filepath.Join(repoRoot, "test", "otlpsink"), sinkBin, "."},
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(goTool(), "build", "-o", j.out, j.pkg)
			cmd.Dir = j.dir
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("building %s in %s: %v\n%s", j.pkg, j.dir, err, out)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func needRoot(t testing.TB) {
	t.Helper()
	if rootReason != "" {
		t.Skip(rootReason)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// pick returns the CI length, or the soak length under GYMTRACE_SOAK=1.
func pick(ci, long time.Duration) time.Duration {
	if soak {
		return long
	}
	return ci
}

// --- processes ---------------------------------------------------------------

// The child-process helpers live in test/testproc, shared with the
// end-to-end tests.
type (
	proc    = testproc.Proc
	syncBuf = testproc.Buffer
)

func startProc(t testing.TB, name string, argv []string, env ...string) *proc {
	t.Helper()
	return testproc.Start(t, t, name, argv, testproc.Options{Env: env})
}

var (
	tail     = testproc.Tail
	freePort = testproc.FreePort
)

// procStatus reads one field of /proc/PID/status ("VmHWM" -> "12345 kB").
func procStatus(pid int, field string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// memKiB reads a Vm* field of /proc/PID/status in KiB.
func memKiB(t testing.TB, pid int, field string) int {
	t.Helper()
	v, err := procStatus(pid, field)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSuffix(v, " kB"))
	if err != nil {
		t.Fatalf("%s of %d: %q: %v", field, pid, v, err)
	}
	return n
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// --- the traced HTTP server ----------------------------------------------------

// server is a Go HTTP/1.1 server (this test binary re-executed) that gymtrace
// traces. Go's net/http reads and writes sockets with read(2)/write(2), like
// uvicorn's, and is fast enough to drive a ring buffer over capacity.
type server struct {
	*proc
	addr string
}

func startServer(t testing.TB, env ...string) *server {
	t.Helper()
	p := startProc(t, "http server", []string{selfBin}, append([]string{childEnv + "=httpserver"}, env...)...)
	line := p.WaitOutput(t, false, "listening ", 10*time.Second)
	return &server{proc: p, addr: strings.TrimSpace(strings.TrimPrefix(line, "listening "))}
}

func (s *server) url(path string) string { return "http://" + s.addr + path }

// get sends one GET on a fresh connection and wants a 200.
func get(t testing.TB, url string) { t.Helper(); send(t, "GET", url) }

// send sends one request (a POST has a small JSON body) on a fresh
// connection and wants a 200.
func send(t testing.TB, method, url string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader(`{"x": 1}`)
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %s", method, url, resp.Status)
	}
}

// loadResult counts a load generator's outcomes.
type loadResult struct{ ok, bad, errs atomic.Int64 }

func (r *loadResult) String() string {
	return fmt.Sprintf("%d ok, %d non-200, %d errors", r.ok.Load(), r.bad.Load(), r.errs.Load())
}

// load sends GETs to url from conc keep-alive clients until ctx ends, each
// waiting every between requests (0: as fast as it can).
func load(ctx context.Context, url string, conc int, every time.Duration) *loadResult {
	res := &loadResult{}
	tr := &http.Transport{MaxIdleConnsPerHost: conc}
	c := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				resp, err := c.Do(req)
				switch {
				case err != nil:
					if ctx.Err() == nil {
						res.errs.Add(1)
					}
				default:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						res.ok.Add(1)
					} else {
						res.bad.Add(1)
					}
				}
				if every > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(every):
					}
				}
			}
		}()
	}
	go func() { wg.Wait(); tr.CloseIdleConnections() }()
	return res
}

// --- gymtrace ----------------------------------------------------------------

type gymtrace struct {
	*proc
	metricsAddr string
	jsonl       string
}

type gtOpts struct {
	pids   []int
	groups string // default "server"
	otlp   string // OTLP endpoint; jsonl to a temp file when ""
	extra  []string
	env    []string
}

// startGymtrace runs gymtrace on pids and waits for "gymtrace: attached".
func startGymtrace(t testing.TB, o gtOpts) *gymtrace {
	t.Helper()
	var pids []string
	for _, p := range o.pids {
		pids = append(pids, strconv.Itoa(p))
	}
	if o.groups == "" {
		o.groups = "server"
	}
	g := &gymtrace{metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	argv := []string{gymtraceBin, "--span-groups", o.groups, "--metrics-addr", g.metricsAddr}
	if len(pids) > 0 {
		argv = append(argv, "--pid", strings.Join(pids, ","))
	}
	if o.otlp != "" {
		argv = append(argv, "--otlp-endpoint", o.otlp)
	} else {
		g.jsonl = filepath.Join(t.TempDir(), "spans.jsonl")
		argv = append(argv, "--exporter", "jsonl", "--output", g.jsonl)
	}
	argv = append(argv, o.extra...)
	env := append([]string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "GYMTRACE_SPAN_GROUPS="}, o.env...)
	g.proc = startProc(t, "gymtrace", argv, env...)
	g.WaitAttached(t)
	return g
}

// metrics scrapes /metrics: "name{labels}" -> value.
func (g *gymtrace) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + g.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scraping gymtrace's metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// terminate sends SIGTERM and waits for "gymtrace: detached" and the exit,
// and logs how long the exit took. Its bound tells a hang from an exit, and
// is no measure of speed.
func (g *gymtrace) terminate(t testing.TB) {
	t.Helper()
	sent := time.Now()
	syscall.Kill(g.Pid(), syscall.SIGTERM)
	select {
	case <-g.Done:
	case <-time.After(60 * time.Second):
		t.Fatalf("gymtrace did not exit within 60 s of SIGTERM: it hangs; stderr:\n%s", tail(g.Stderr.String(), 4096))
	}
	t.Logf("gymtrace exited %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
	if g.Err != nil {
		t.Errorf("gymtrace exited with %v after SIGTERM; stderr:\n%s", g.Err, tail(g.Stderr.String(), 4096))
	}
	if !strings.Contains(g.Stderr.String(), "gymtrace: detached") {
		t.Errorf("gymtrace exited without logging \"gymtrace: detached\"")
	}
	checkNoPanic(t, "gymtrace", g.Stderr.String())
}

func checkNoPanic(t testing.TB, who, stderr string) {
	t.Helper()
	for _, bad := range []string{"panic:", "goroutine ", "internal error", "fatal error:", "SIGSEGV"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%s's stderr holds %q:\n%s", who, bad, tail(stderr, 4096))
			return
		}
	}
}

// span is one exported span, as jsonl and the OTLP sink write it.
type span struct {
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	Attributes map[string]any `json:"attributes"`
	Resource   map[string]any `json:"resource"`
}

func (s span) pid() int {
	f, _ := s.Resource["process.pid"].(float64)
	return int(f)
}

func (s span) path() string {
	p, _ := s.Attributes["url.path"].(string)
	return p
}

// readSpans reads a jsonl span file; a missing file is no spans.
func readSpans(t testing.TB, file string) []span {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []span
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var s span
		if err := json.Unmarshal(line, &s); err != nil {
			continue // a line being written right now
		}
		out = append(out, s)
	}
	return out
}

// waitSpan polls file until a span matches, or fails after timeout.
func waitSpan(t testing.TB, file string, timeout time.Duration, what string, match func(span) bool) span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, s := range readSpans(t, file) {
			if match(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no span %s in %s within %v (%d spans there)", what, file, timeout, len(readSpans(t, file)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func uniquePath(prefix string) string {
	return fmt.Sprintf("/%s-%d", prefix, time.Now().UnixNano())
}

// --- BPF objects ---------------------------------------------------------------

// bpfObjects lists the BPF program and map ids a process holds open, from
// /proc/PID/fdinfo (links name their program too).
func bpfObjects(pid int) (progs, maps map[uint32]bool, err error) {
	progs, maps = map[uint32]bool{}, map[uint32]bool{}
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				continue
			}
			switch strings.TrimSpace(k) {
			case "prog_id":
				progs[uint32(n)] = true
			case "map_id":
				maps[uint32(n)] = true
			}
		}
	}
	return progs, maps, nil
}

// bpftoolProgs lists loaded programs: id -> name.
func bpftoolProgs(t testing.TB) map[uint32]string {
	t.Helper()
	out, err := exec.Command("bpftool", "-j", "prog", "show").Output()
	if err != nil {
		t.Skipf("needs bpftool (apt-get install bpftool): %v", err)
	}
	var progs []struct {
		ID   uint32 `json:"id"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(out, &progs); err != nil {
		t.Fatalf("parsing `bpftool -j prog show`: %v", err)
	}
	m := map[uint32]string{}
	for _, p := range progs {
		m[p.ID] = p.Name
	}
	return m
}

// --- child processes ---------------------------------------------------------

func runChild(mode string) int {
	switch mode {
	case "httpserver":
		return httpServerMain()
	case "supervisor":
		return supervisorMain()
	}
	fmt.Fprintf(os.Stderr, "unknown %s=%s\n", childEnv, mode)
	return 2
}

// httpServerMain serves HTTP/1.1 on GT_REL_ADDR (default a free port):
// every path answers 200 "ok"; /echo answers the request body; /login sets
// a session cookie to GT_REL_COOKIE.
func httpServerMain() int {
	addr := os.Getenv("GT_REL_ADDR")
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	// A restarted server may find its port still held by the killed one's
	// sockets for a moment.
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(b)
	})
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.SetCookie(w, &http.Cookie{Name: "session", Value: os.Getenv("GT_REL_COOKIE")})
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	fmt.Printf("listening %s\n", ln.Addr())
	return func() int {
		if err := http.Serve(ln, mux); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}()
}

// supervisorMain keeps one HTTP server child running on GT_REL_ADDR, as a
// process manager does, and prints "child PID" for each one it starts. After
// a child dies it reads one line from stdin before starting the next: empty
// for any PID, "pid N" to make the kernel give the child PID N (through
// /proc/sys/kernel/ns_last_pid, as CRIU does), so a test can reuse a PID.
func supervisorMain() int {
	in := bufio.NewScanner(os.Stdin)
	want := 0
	for {
		var cmd *exec.Cmd
		for try := 0; ; try++ {
			if want > 1 {
				os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(want-1)), 0)
			}
			cmd = exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), childEnv+"=httpserver")
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			if err := cmd.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			if want == 0 || cmd.Process.Pid == want || try == 200 {
				break
			}
			cmd.Process.Kill()
			cmd.Wait()
		}
		fmt.Printf("child %d\n", cmd.Process.Pid)
		cmd.Wait()
		if !in.Scan() {
			return 0
		}
		want = 0
		if v, ok := strings.CutPrefix(strings.TrimSpace(in.Text()), "pid "); ok {
			want, _ = strconv.Atoi(v)
		}
	}
}
