//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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

	"github.com/gymtrace/gymtrace/test/testproc"
)

// The interpreter with Debian's fastapi, uvicorn and aiohttp (the python3 on
// PATH may be a pyenv without them).
const python = "/usr/bin/python3"

// Set by TestMain.
var (
	repoRoot    string
	binDir      string
	gymtraceBin string
	sinkBin     string
	buildErr    error
	rootReason  string // why tests that load BPF skip; "" when they can run
	stackReason string // why tests on the Python stack skip
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		// This binary re-executed as a traced HTTP server or client.
		os.Exit(runChild(mode))
	}
	code := func() int {
		var err error
		repoRoot, err = filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: finding the repository root: %v\n", err)
			return 1
		}
		rootReason, stackReason = checkEnv()
		if rootReason == "" {
			binDir, err = os.MkdirTemp("", "gymtrace-e2e-bin-")
			if err != nil {
				fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
				return 1
			}
			defer os.RemoveAll(binDir)
			buildErr = buildBinaries()
		}
		defer runSharedCleanups()
		return m.Run()
	}()
	os.Exit(code)
}

// checkEnv says why tests cannot run here: BPF needs root, the stack needs
// /usr/bin/python3 with fastapi, uvicorn and aiohttp.
func checkEnv() (root, stack string) {
	if os.Geteuid() != 0 {
		root = "needs root: gymtrace loads BPF programs and reads other processes' /proc; run `sudo go test ./test/e2e/`"
		return root, root
	}
	if _, err := os.Stat(python); err != nil {
		return "", fmt.Sprintf("needs %s (Debian's python3) with fastapi, uvicorn and aiohttp: %v", python, err)
	}
	out, err := exec.Command(python, "-c", "import fastapi, uvicorn, aiohttp").CombinedOutput()
	if err != nil {
		return "", fmt.Sprintf("needs %s with fastapi, uvicorn and aiohttp (apt-get install python3-fastapi python3-uvicorn python3-aiohttp): %v: %s",
			python, err, bytes.TrimSpace(out))
	}
	return "", ""
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if p := filepath.Join(os.Getenv("GOROOT"), "bin", "go"); os.Getenv("GOROOT") != "" {
		return p
	}
	return "/usr/local/go/bin/go"
}

// buildBinaries builds gymtrace and the OTLP sink (its own module) once for
// the whole test binary, in parallel.
func buildBinaries() error {
	gymtraceBin = filepath.Join(binDir, "gymtrace")
	sinkBin = filepath.Join(binDir, "otlpsink")
	jobs := []struct {
		dir, out, pkg string
	}{
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

func needStack(t testing.TB) {
	t.Helper()
	needRoot(t)
	if stackReason != "" {
		t.Skip(stackReason)
	}
}

// --- processes ---------------------------------------------------------------

// owner receives a process's cleanup: a test (t.Cleanup), or the shared list
// run by TestMain for resources several tests use.
type owner interface{ Cleanup(func()) }

type sharedOwner struct{}

var (
	sharedMu       sync.Mutex
	sharedCleanups []func()
)

func (sharedOwner) Cleanup(f func()) {
	sharedMu.Lock()
	sharedCleanups = append(sharedCleanups, f)
	sharedMu.Unlock()
}

func runSharedCleanups() {
	sharedMu.Lock()
	fs := sharedCleanups
	sharedCleanups = nil
	sharedMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// The child-process helpers live in test/testproc, shared with the
// reliability tests.
type (
	proc     = testproc.Proc
	procOpts = testproc.Options
	syncBuf  = testproc.Buffer
)

func startProc(t testing.TB, own owner, name string, argv []string, o procOpts) *proc {
	t.Helper()
	return testproc.Start(t, own, name, argv, o)
}

var (
	tail     = testproc.Tail
	freePort = testproc.FreePort
)

// --- gymtrace ----------------------------------------------------------------

type gymtrace struct {
	*proc
	metricsAddr string
}

type gtOpts struct {
	pids   []int
	groups string
	otlp   string // OTLP endpoint; "" with jsonl set
	jsonl  string // --exporter jsonl --output FILE
	extra  []string
	env    []string // added to gymtrace's environment
}

// startGymtrace runs gymtrace on the given pids and waits for its
// "gymtrace: attached" line.
func startGymtrace(t testing.TB, o gtOpts) *gymtrace {
	t.Helper()
	var pids []string
	for _, p := range o.pids {
		pids = append(pids, strconv.Itoa(p))
	}
	g := &gymtrace{metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	argv := []string{gymtraceBin, "--span-groups", o.groups, "--metrics-addr", g.metricsAddr}
	if len(pids) > 0 {
		argv = append(argv, "--pid", strings.Join(pids, ","))
	} // else discovery: every Gym process on the host, including later ones
	switch {
	case o.otlp != "":
		argv = append(argv, "--otlp-endpoint", o.otlp)
	case o.jsonl != "":
		argv = append(argv, "--exporter", "jsonl", "--output", o.jsonl)
	}
	argv = append(argv, o.extra...)
	// The environment must not point the exporter elsewhere.
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "GYMTRACE_SPAN_GROUPS="}
	env = append(env, o.env...)
	g.proc = startProc(t, t, "gymtrace", argv, procOpts{Env: env})
	g.WaitAttached(t)
	return g
}

// metrics scrapes /metrics: "name{labels}" -> value.
func (g *gymtrace) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	resp := scrapeGet(t, g.metricsAddr)
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// scrapeTimeout bounds one scrape of gymtrace's /metrics: a bound on a
// failure (an endpoint that never answers), not a speed asserted. On a
// machine as loaded as the busy causality cases beside the kernel matrix's
// guests, a scrape took over 5 s (ci28); how long it took is logged when
// over a second.
const scrapeTimeout = 60 * time.Second

// scrapeGet GETs gymtrace's /metrics at addr.
func scrapeGet(t testing.TB, addr string) *http.Response {
	t.Helper()
	c := &http.Client{Timeout: scrapeTimeout}
	t0 := time.Now()
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping gymtrace's metrics: %v (after %v)", err, time.Since(t0).Round(time.Millisecond))
	}
	if d := time.Since(t0); d > time.Second {
		t.Logf("scraping gymtrace's metrics took %v", d.Round(time.Millisecond))
	}
	return resp
}

// parseMetrics reads a Prometheus text scrape: series (name{labels}) -> value.
func parseMetrics(r io.Reader) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
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
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// groupCounters picks one per-group family out of a scrape: group -> value.
func groupCounters(m map[string]float64, family string) map[string]float64 {
	out := map[string]float64{}
	prefix := family + `{group="`
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			out[strings.TrimSuffix(k[len(prefix):], `"}`)] = v
		}
	}
	return out
}

func sumValues(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// settle waits until gymtrace has built at least want spans (when want > 0)
// and the count has not moved for 400 ms, so that SIGTERM loses nothing that
// is still in the ring buffer.
func (g *gymtrace) settle(t testing.TB, want int) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last, lastChange := -1.0, time.Now()
	for {
		m := g.metrics(t)
		built := sumValues(groupCounters(m, "gymtrace_spans_built_total"))
		if built != last {
			last, lastChange = built, time.Now()
		}
		if built >= float64(want) && time.Since(lastChange) >= 400*time.Millisecond {
			return m
		}
		if time.Now().After(deadline) {
			t.Errorf("gymtrace built %v spans, want at least %d (gave up waiting after 20 s)", built, want)
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shutdownHang bounds gymtrace's exit after SIGTERM. It tells a hang from
// an exit, and is no measure of speed: on a loaded 2-core machine the
// kernel's detaches take their time (the exit time is logged instead).
const shutdownHang = 60 * time.Second

// shutdown sends SIGTERM and requires a clean exit with a "gymtrace: detached"
// line; it logs how long the exit took.
func (g *gymtrace) shutdown(t testing.TB) {
	t.Helper()
	if g.Exited() {
		t.Fatalf("gymtrace exited before the test stopped it (%v); stderr:\n%s", g.Err, tail(g.Stderr.String(), 4096))
	}
	sent := time.Now()
	g.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.Done:
	case <-time.After(shutdownHang):
		t.Fatalf("gymtrace did not exit within %v of SIGTERM: it hangs; stderr:\n%s", shutdownHang, tail(g.Stderr.String(), 4096))
	}
	t.Logf("gymtrace exited %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
	if g.Err != nil {
		t.Errorf("gymtrace exited with %v after SIGTERM; stderr:\n%s", g.Err, tail(g.Stderr.String(), 4096))
	}
	if !strings.Contains(g.Stderr.String(), "gymtrace: detached") {
		t.Errorf("gymtrace logged no \"gymtrace: detached\" line; stderr:\n%s", tail(g.Stderr.String(), 4096))
	}
}

// --- OTLP sink ---------------------------------------------------------------

type sink struct {
	*proc
	addr string
	out  string
}

func startSink(t testing.TB) *sink {
	t.Helper()
	s := &sink{out: filepath.Join(t.TempDir(), "otlp-spans.jsonl")}
	s.proc = startProc(t, t, "otlpsink", []string{sinkBin, "--out", s.out, "--listen", "127.0.0.1:0"}, procOpts{})
	line := s.WaitOutput(t, false, "listening ", 30*time.Second)
	s.addr = strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	return s
}

func (s *sink) endpoint() string { return "http://" + s.addr }

// --- spans -------------------------------------------------------------------

// Span is one exported span, as the OTLP sink and gymtrace's jsonl exporter
// both write it.
type Span struct {
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Parent     string         `json:"parent_span_id"`
	Start      uint64         `json:"start_time_unix_nano"`
	End        uint64         `json:"end_time_unix_nano"`
	Attributes map[string]any `json:"attributes"`
	Resource   map[string]any `json:"resource"`
	Status     struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"status"`
}

func (s Span) Attr(k string) string { return anyString(s.Attributes[k]) }
func (s Span) Res(k string) string  { return anyString(s.Resource[k]) }
func (s Span) AttrInt(k string) int { return anyInt(s.Attributes[k]) }
func (s Span) PID() int             { return anyInt(s.Resource["process.pid"]) }

func (s Span) Duration() time.Duration { return time.Duration(int64(s.End) - int64(s.Start)) }

// Path is url.path for a SERVER span and the path of url.full for a CLIENT one.
func (s Span) Path() string {
	if p := s.Attr("url.path"); p != "" {
		return p
	}
	u := s.Attr("url.full")
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
		if j := strings.IndexByte(u, '/'); j >= 0 {
			return u[j:]
		}
		return "/"
	}
	return ""
}

func (s Span) String() string {
	return fmt.Sprintf("%s %q pid=%d path=%s status=%s/%d span=%s parent=%s trace=%s",
		s.Kind, s.Name, s.PID(), s.Path(), s.Status.Code, s.AttrInt("http.response.status_code"), s.SpanID, s.Parent, s.TraceID) +
		bracket(debugAttrs(s))
}

func bracket(s string) string {
	if s == "" {
		return ""
	}
	return " [" + s + "]"
}

func anyString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	default:
		return fmt.Sprint(x)
	}
}

func anyInt(v any) int {
	switch x := v.(type) {
	case float64:
		return int(x)
	case string:
		n, _ := strconv.Atoi(x)
		return n
	}
	return 0
}

func readSpans(t testing.TB, path string) []Span {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []Span
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var s Span
		if err := json.Unmarshal(line, &s); err != nil {
			t.Fatalf("%s line %d is not a JSON span: %v: %s", path, i+1, err, tail(string(line), 300))
		}
		out = append(out, s)
	}
	return out
}

type spanSet struct {
	all  []Span
	byID map[string]Span
}

func newSpanSet(spans []Span) *spanSet {
	s := &spanSet{all: spans, byID: map[string]Span{}}
	for _, sp := range spans {
		s.byID[sp.SpanID] = sp
	}
	return s
}

func (s *spanSet) filter(f func(Span) bool) []Span {
	var out []Span
	for _, sp := range s.all {
		if f(sp) {
			out = append(out, sp)
		}
	}
	return out
}

func (s *spanSet) parent(sp Span) (Span, bool) {
	p, ok := s.byID[sp.Parent]
	return p, ok
}

func (s *spanSet) dump(t testing.TB) {
	t.Helper()
	lines := make([]string, 0, len(s.all))
	for _, sp := range s.all {
		lines = append(lines, sp.String())
	}
	sort.Strings(lines)
	t.Logf("%d spans:\n%s", len(lines), strings.Join(lines, "\n"))
}

// countBy counts spans by a key.
func countBy(spans []Span, key func(Span) string) map[string]int {
	out := map[string]int{}
	for _, s := range spans {
		out[key(s)]++
	}
	return out
}

func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
