//go:build linux

// Package tls holds the end-to-end tests of HTTPS tracing (issue 7): the
// gymtrace binary attached by PID to a Python aiohttp model server that calls
// a local HTTPS upstream (self-signed certificate made here), exporting jsonl.
// They need root, /usr/bin/python3 with aiohttp, and the openssl CLI; without
// them every test skips and says why.
//
//	sudo go test ./test/tls/ -v -count=1
//	sudo GYMTRACE_TLS_BENCH=1 go test ./test/tls/ -run Bench -v -count=1
package tls

import (
	"bufio"
	"bytes"
	ctls "crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/testproc"
)

const python = "/usr/bin/python3"

var gymtraceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gymtrace-tls-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gymtraceBin = filepath.Join(dir, "gymtrace")
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-o", gymtraceBin, "../../cmd/gymtrace")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building gymtrace: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needEnv(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: gymtrace loads BPF programs and attaches uprobes")
	}
	if out, err := exec.Command(python, "-c", "import aiohttp").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import aiohttp (apt-get install python3-aiohttp): %v %s", python, err, out)
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl CLI to make the test certificate")
	}
}

// --- processes ---------------------------------------------------------------

type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
	stderr *syncBuf
	done   chan struct{}
}

type syncBuf = testproc.Buffer

var freePort = testproc.FreePort

func start(t *testing.T, argv ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), stderr: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "GYMTRACE_SPAN_GROUPS=")
	p.stdin, _ = p.cmd.StdinPipe()
	out, _ := p.cmd.StdoutPipe()
	p.stdout = bufio.NewScanner(out)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", argv[0], err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stdin.Close()
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) line(t *testing.T) string {
	t.Helper()
	if !p.stdout.Scan() {
		t.Fatalf("%s exited; stderr:\n%s", p.cmd.Path, p.stderr.String())
	}
	return p.stdout.Text()
}

func (p *proc) waitStderr(t *testing.T, substr string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(p.stderr.String(), substr) {
			return
		}
	}
	t.Fatalf("no %q from %s within %v; stderr:\n%s", substr, p.cmd.Path, d, p.stderr.String())
}

// --- upstream ----------------------------------------------------------------

// upstream is an OpenAI-compatible HTTPS endpoint: /v1/chat/completions
// streams three SSE events `gap` apart (chunked); other paths answer JSON.
type upstream struct {
	port int
	ca   string
	gap  time.Duration
	auth chan string // Authorization values seen, to prove the token was sent
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	out, err := exec.Command("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
		"-out", cert, "-days", "2", "-subj", "/CN=localhost",
		"-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1").CombinedOutput()
	if err != nil {
		t.Fatalf("openssl req: %v\n%s", err, out)
	}
	kp, err := ctls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ca: cert, gap: 80 * time.Millisecond, auth: make(chan string, 1024)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case u.auth <- r.Header.Get("Authorization"):
		default:
		}
		if r.URL.Path != "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id": "x", "choices": []}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			if i > 0 {
				time.Sleep(u.gap)
			}
			fmt.Fprintf(w, "data: {\"delta\": %d}\n\n", i)
			w.(http.Flusher).Flush()
		}
	}))
	srv.TLS = &ctls.Config{Certificates: []ctls.Certificate{kp}, NextProtos: []string{"http/1.1"}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return u
}

// startPlainUpstream is the upstream over plain HTTP: /v1/chat/completions
// streams three SSE events 80 ms apart, other paths answer JSON.
func startPlainUpstream(t *testing.T) int {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 3; i++ {
				if i > 0 {
					time.Sleep(80 * time.Millisecond)
				}
				fmt.Fprintf(w, "data: {\"delta\": %d}\n\n", i)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id": "x", "choices": []}`))
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// --- gymtrace ----------------------------------------------------------------

type gymtrace struct {
	*proc
	metricsAddr string
	out         string
}

func startGymtrace(t *testing.T, groups string, pids ...string) *gymtrace {
	t.Helper()
	g := &gymtrace{metricsAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), out: filepath.Join(t.TempDir(), "spans.jsonl")}
	g.proc = start(t, gymtraceBin, "--pid", strings.Join(pids, ","), "--span-groups", groups,
		"--exporter", "jsonl", "--output", g.out, "--metrics-addr", g.metricsAddr)
	g.waitStderr(t, "gymtrace: attached", 60*time.Second)
	return g
}

// kernelCounter reads gymtrace_kernel_events_total{reason=...}.
func (g *gymtrace) kernelCounter(t *testing.T, reason string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	defer resp.Body.Close()
	want := `gymtrace_kernel_events_total{reason="` + reason + `"} `
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no %s in gymtrace's metrics", strings.TrimSpace(want))
	return 0
}

// stop sends SIGTERM, waits for the clean exit and returns the spans.
func (g *gymtrace) stop(t *testing.T) []span {
	t.Helper()
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("gymtrace did not stop; stderr:\n%s", g.stderr.String())
	}
	if !strings.Contains(g.stderr.String(), "gymtrace: detached") {
		t.Errorf("no clean detach; stderr:\n%s", g.stderr.String())
	}
	data, err := os.ReadFile(g.out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("TOPSECRET")) || strings.Contains(g.stderr.String(), "TOPSECRET") {
		t.Errorf("the bearer token or the request body reached the export or the logs")
	}
	var out []span
	for _, l := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var s span
		if err := json.Unmarshal(l, &s); err != nil {
			t.Fatalf("bad jsonl line %q: %v", l, err)
		}
		out = append(out, s)
	}
	return out
}

type span struct {
	Name       string         `json:"name"`
	Kind       string         `json:"kind"`
	TraceID    string         `json:"trace_id"`
	SpanID     string         `json:"span_id"`
	Parent     string         `json:"parent_span_id"`
	Start      uint64         `json:"start_time_unix_nano"`
	End        uint64         `json:"end_time_unix_nano"`
	Attributes map[string]any `json:"attributes"`
}

func (s span) attr(k string) string {
	switch v := s.Attributes[k].(type) {
	case nil:
		return ""
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

func (s span) dur() time.Duration { return time.Duration(int64(s.End) - int64(s.Start)) }

// --- the model server --------------------------------------------------------

type modelServer struct {
	*proc
	port int
}

func startModel(t *testing.T, u *upstream) *modelServer {
	t.Helper()
	m := &modelServer{port: freePort(t)}
	m.proc = start(t, python, "testdata/model_server.py", strconv.Itoa(m.port),
		fmt.Sprintf("https://127.0.0.1:%d/v1/chat/completions", u.port), u.ca)
	if l := m.line(t); l != "listening" {
		t.Fatalf("model server said %q", l)
	}
	return m
}

func (m *modelServer) call(t *testing.T) {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/responses", m.port), "application/json",
		strings.NewReader(`{"input": "hi"}`))
	if err != nil {
		t.Fatalf("calling the model server: %v\n%s", err, m.stderr.String())
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Status int `json:"upstream_status"`
		Parts  int `json:"parts"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &got) != nil || got.Status != 200 || got.Parts != 3 {
		t.Fatalf("model server answered %d %s", resp.StatusCode, body)
	}
}

// --- tests -------------------------------------------------------------------

func TestHTTPSClientSpans(t *testing.T) {
	needEnv(t)
	u := startUpstream(t)
	m := startModel(t, u)
	g := startGymtrace(t, "default", strconv.Itoa(m.cmd.Process.Pid)+"=model")
	g.waitStderr(t, "TLS probes attached", 10*time.Second)
	const calls = 3
	for i := 0; i < calls; i++ {
		m.call(t)
	}
	if a := <-u.auth; a != "Bearer TOPSECRET" {
		t.Fatalf("the upstream saw Authorization %q: the test does not exercise the token", a)
	}
	time.Sleep(500 * time.Millisecond)
	if n := g.kernelCounter(t, "tls_events"); n < 2*calls {
		t.Errorf("tls_events %v, want at least %d", n, 2*calls)
	}
	spans := g.stop(t)

	servers := map[string]span{}
	var clients []span
	for _, s := range spans {
		t.Logf("%s %q span=%s parent=%s url.full=%s status=%s %v", s.Kind, s.Name, s.SpanID, s.Parent,
			s.attr("url.full"), s.attr("http.response.status_code"), s.dur())
		switch {
		case s.Kind == "SERVER" && s.Name == "POST /v1/responses":
			servers[s.SpanID] = s
		case s.Kind == "CLIENT":
			clients = append(clients, s)
		}
	}
	if len(servers) != calls || len(clients) != calls {
		t.Fatalf("%d server and %d client spans, want %d of each", len(servers), len(clients), calls)
	}
	wantURL := fmt.Sprintf("https://127.0.0.1:%d/v1/chat/completions", u.port)
	for _, c := range clients {
		if c.Name != "HTTP POST" || c.attr("url.full") != wantURL || c.attr("http.response.status_code") != "200" {
			t.Errorf("client span %q url.full %q status %s, want HTTP POST %s 200",
				c.Name, c.attr("url.full"), c.attr("http.response.status_code"), wantURL)
		}
		if c.attr("server.port") != strconv.Itoa(u.port) {
			t.Errorf("server.port %s, want %d", c.attr("server.port"), u.port)
		}
		if c.attr("network.local.port") == "0" || c.attr("network.local.port") == "" {
			t.Errorf("network.local.port %q: the SSL object was not tied to its socket", c.attr("network.local.port"))
		}
		// The stream's true end: two gaps between three events.
		if c.dur() < 2*u.gap {
			t.Errorf("client span lasted %v, the upstream streamed for %v", c.dur(), 2*u.gap)
		}
		p, ok := servers[c.Parent]
		if !ok {
			t.Errorf("client span's parent %q is not the inbound request's span", c.Parent)
			continue
		}
		if c.TraceID != p.TraceID || c.Start < p.Start || c.End > p.End {
			t.Errorf("client span not inside its parent: [%d,%d] vs [%d,%d]", c.Start, c.End, p.Start, p.End)
		}
	}
}

// With http_client off the probes run (server is on) but emit nothing; with
// http_client and server off no probe is attached at all.
func TestHTTPSGateOff(t *testing.T) {
	needEnv(t)
	u := startUpstream(t)
	m := startModel(t, u)
	pid := strconv.Itoa(m.cmd.Process.Pid) + "=model"

	g := startGymtrace(t, "server", pid)
	g.waitStderr(t, "TLS probes attached", 10*time.Second)
	m.call(t)
	m.call(t)
	time.Sleep(500 * time.Millisecond)
	if n := g.kernelCounter(t, "tls_calls"); n == 0 {
		t.Errorf("tls_calls 0: the probes did not run, so the gate was not tested")
	}
	if n := g.kernelCounter(t, "tls_events"); n != 0 {
		t.Errorf("%v TLS records emitted with http_client off", n)
	}
	for _, s := range g.stop(t) {
		if s.Kind == "CLIENT" {
			t.Errorf("client span with http_client off: %q %s", s.Name, s.attr("url.full"))
		}
	}

	g = startGymtrace(t, "job,rollout", pid)
	m.call(t)
	time.Sleep(300 * time.Millisecond)
	if n := g.kernelCounter(t, "tls_calls"); n != 0 {
		t.Errorf("%v TLS probe runs with http_client and server off: probes are attached", n)
	}
	if strings.Contains(g.stderr.String(), "TLS probes attached") {
		t.Errorf("TLS probes attached with http_client and server off")
	}
	g.stop(t)
}

// Concurrent inbound requests: each HTTPS call made by a handler must get
// that handler's request as parent exactly as well as the same call over
// plain HTTP does (asyncio causality is read at the message start, which the
// TLS probes reach on the calling thread like a socket syscall). Parity, not
// an absolute: the plain-HTTP baseline is internal/python's to guarantee.
func TestHTTPSParentsConcurrent(t *testing.T) {
	needEnv(t)
	plain := concurrentParents(t, false)
	https := concurrentParents(t, true)
	t.Logf("client spans with their handler's request as parent: plain HTTP %d/%d, HTTPS %d/%d",
		plain, 2*concurrentCalls, https, 2*concurrentCalls)
	if https < plain {
		t.Errorf("HTTPS resolved %d parents, plain HTTP %d: TLS loses asyncio causality", https, plain)
	}
}

const concurrentCalls = 4

// concurrentParents runs two rounds of concurrentCalls simultaneous model
// calls and returns how many client spans have their own handler's server
// span as parent. A wrong parent fails the test; a missing one is counted.
func concurrentParents(t *testing.T, https bool) int {
	u := startUpstream(t)
	m := &modelServer{}
	if https {
		m = startModel(t, u)
	} else {
		m.port = freePort(t)
		m.proc = start(t, python, "testdata/model_server.py", strconv.Itoa(m.port),
			fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", startPlainUpstream(t)), u.ca)
		if l := m.line(t); l != "listening" {
			t.Fatalf("model server said %q", l)
		}
	}
	g := startGymtrace(t, "default", strconv.Itoa(m.cmd.Process.Pid)+"=model")
	if https {
		g.waitStderr(t, "TLS probes attached", 10*time.Second)
	}
	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		for i := 0; i < concurrentCalls; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); m.call(t) }()
		}
		wg.Wait()
	}
	time.Sleep(500 * time.Millisecond)
	spans := g.stop(t)
	servers := map[string]span{}
	var clients []span
	for _, s := range spans {
		switch s.Kind {
		case "SERVER":
			servers[s.SpanID] = s
		case "CLIENT":
			clients = append(clients, s)
			if https != strings.HasPrefix(s.attr("url.full"), "https://") {
				t.Errorf("url.full %q (https=%v)", s.attr("url.full"), https)
			}
		}
	}
	if len(servers) != 2*concurrentCalls || len(clients) != 2*concurrentCalls {
		t.Fatalf("%d server and %d client spans, want %d of each", len(servers), len(clients), 2*concurrentCalls)
	}
	resolved := 0
	parents := map[string]bool{}
	for _, c := range clients {
		p, ok := servers[c.Parent]
		switch {
		case !ok && c.Parent != "":
			t.Errorf("client span %s: parent %q is no server span", c.SpanID, c.Parent)
		case !ok:
			// A root, marked gymtrace.parent.unresolved: counted, not wrong.
		case c.Start < p.Start || c.End > p.End:
			t.Errorf("client span %s outside its parent", c.SpanID)
		case parents[c.Parent]:
			t.Errorf("two client spans under server span %s", c.Parent)
		default:
			parents[c.Parent] = true
			resolved++
		}
	}
	return resolved
}
