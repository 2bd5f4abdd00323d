//go:build linux

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A scenario is client traffic the driver child plays against the server
// child (drive runs in the driver), and what gymtrace must make of it (check
// runs in the test). Every path a scenario uses starts with /<name>/, so its
// spans are told apart from the others'.
type scenario struct {
	name  string
	pre   bool // played before gymtrace attaches (a connection that predates it)
	drive func(addr string) (map[string]string, error)
	check func(t *testing.T, k *kernelRun, res map[string]string)
}

func scenarioByName(name string) (scenario, bool) {
	for _, list := range [][]scenario{kernelScenarios, hostileScenarios, secretScenarios, {joinRaceScenario}} {
		for _, s := range list {
			if s.name == name {
				return s, true
			}
		}
	}
	return scenario{}, false
}

// The traceparent the scenarios send: Gym's http_client would write one like
// it, and the server span must join its trace.
const (
	tpTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	tpParent = "00f067aa0ba902b7"
	tpHeader = "00-" + tpTrace + "-" + tpParent + "-01"
)

// --- the kernel-level run -------------------------------------------------------

type kernelRun struct {
	addr      string
	host      string
	port      int
	serverPID int
	driverPID int
	spans     *spanSet
	metrics   map[string]float64
	stdout    string // gymtrace's
	stderr    string
	jsonl     string // the exported file's content
	results   map[string]map[string]string
}

func startChild(t *testing.T, mode string, env ...string) *proc {
	t.Helper()
	return startProc(t, t, mode, []string{os.Args[0], "-test.run=^$"},
		procOpts{Env: append([]string{childEnv + "=" + mode}, env...)})
}

// play asks the driver to run one scenario and waits for its answer line.
func play(t *testing.T, driver *proc, sn scenario, addr string) map[string]string {
	t.Helper()
	if _, err := fmt.Fprintf(driver.Stdin, "%s %s\n", sn.name, addr); err != nil {
		t.Fatalf("driver: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, line := range strings.Split(driver.Stdout.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "ok "+sn.name+" "); ok {
				res := map[string]string{}
				if err := jsonUnmarshal(rest, &res); err != nil {
					t.Fatalf("driver answered %q: %v", line, err)
				}
				return res
			}
			if rest, ok := strings.CutPrefix(line, "err "+sn.name+" "); ok {
				t.Fatalf("scenario %s failed on the client side (not gymtrace's fault): %s", sn.name, rest)
			}
		}
		if driver.Exited() || time.Now().After(deadline) {
			t.Fatalf("driver gave no answer for %s (exited=%v); stderr:\n%s", sn.name, driver.Exited(), tail(driver.Stderr.String(), 4096))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runKernel starts the server and driver children, plays the pre scenarios,
// attaches gymtrace to both (jsonl export), plays the rest, stops gymtrace
// and returns what it exported. Each scenario's check runs as a subtest.
func runKernel(t *testing.T, listen, groups string, list []scenario, extra ...string) *kernelRun {
	t.Helper()
	needRoot(t)
	server := startChild(t, "server", "GYMTRACE_E2E_LISTEN="+listen)
	line := server.WaitOutput(t, false, "listening ", 30*time.Second)
	addr := strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portS)
	driver := startChild(t, "driver")
	k := &kernelRun{addr: addr, host: host, port: port, serverPID: server.Pid(), driverPID: driver.Pid(),
		results: map[string]map[string]string{}}

	for _, sn := range list {
		if sn.pre {
			k.results[sn.name] = play(t, driver, sn, addr)
		}
	}
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	gt := startGymtrace(t, gtOpts{pids: []int{server.Pid(), driver.Pid()}, groups: groups, jsonl: out, extra: extra})
	for _, sn := range list {
		if !sn.pre {
			k.results[sn.name] = play(t, driver, sn, addr)
		}
	}
	if gt.Exited() {
		t.Fatalf("gymtrace died during the traffic: %v; stderr:\n%s", gt.Err, tail(gt.Stderr.String(), 4096))
	}
	k.metrics = gt.settle(t, 1)
	gt.shutdown(t)
	k.stdout, k.stderr = gt.Stdout.String(), gt.Stderr.String()
	data, _ := os.ReadFile(out)
	k.jsonl = string(data)
	k.spans = newSpanSet(readSpans(t, out))
	t.Cleanup(func() {
		if t.Failed() {
			k.spans.dump(t)
			t.Logf("kernel counters: %v", kernelCounters(k.metrics))
		}
	})
	for _, sn := range list {
		if sn.check != nil {
			t.Run(sn.name, func(t *testing.T) { sn.check(t, k, k.results[sn.name]) })
		}
	}
	return k
}

func kernelCounters(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "gymtrace_kernel_events_total") || strings.HasPrefix(k, "gymtrace_ringbuf") {
			out[k] = v
		}
	}
	return out
}

func (k *kernelRun) spansAt(kind string, pid int, path string) []Span {
	return k.spans.filter(func(s Span) bool { return s.Kind == kind && s.PID() == pid && s.Path() == path })
}

// exchange checks the SERVER span (server child) and the CLIENT span (driver
// child) of one request: exactly one each, names, status, attributes, and the
// server span's parent is the client span on the same connection (or, with
// tp, both join the traceparent's trace).
func (k *kernelRun) exchange(t *testing.T, method, path string, status int, tp string) (srv, cli Span) {
	t.Helper()
	ss := k.spansAt("SERVER", k.serverPID, path)
	cs := k.spansAt("CLIENT", k.driverPID, path)
	if len(ss) != 1 || len(cs) != 1 {
		t.Errorf("%s %s: %d SERVER and %d CLIENT spans, want 1 and 1", method, path, len(ss), len(cs))
		if len(ss) == 0 || len(cs) == 0 {
			return Span{}, Span{}
		}
	}
	srv, cli = ss[0], cs[0]
	if srv.Name != method+" "+path || srv.Attr("http.request.method") != method || srv.AttrInt("http.response.status_code") != status ||
		srv.AttrInt("server.port") != k.port || srv.Attr("server.address") != k.host || srv.AttrInt("client.port") != cli.AttrInt("network.local.port") {
		t.Errorf("SERVER span %v %v: want %q, status %d, server %s:%d, client.port = the client's network.local.port %d",
			srv, srv.Attributes, method+" "+path, status, k.host, k.port, cli.AttrInt("network.local.port"))
	}
	wantURL := "http://" + k.addr + path
	if cli.Name != "HTTP "+method || cli.AttrInt("http.response.status_code") != status || cli.Attr("url.full") != wantURL ||
		cli.AttrInt("server.port") != k.port {
		t.Errorf("CLIENT span %v %v: want \"HTTP %s\", status %d, url.full %s", cli, cli.Attributes, method, status, wantURL)
	}
	wantStatus := "UNSET"
	if status >= 500 {
		wantStatus = "ERROR"
	}
	if srv.Status.Code != wantStatus {
		t.Errorf("SERVER span status %s for %d, want %s: %v", srv.Status.Code, status, wantStatus, srv)
	}
	if cli.Status.Code == "ERROR" {
		t.Errorf("CLIENT span is ERROR for a %d answer: %v", status, cli)
	}
	for _, s := range []Span{srv, cli} {
		if s.Start == 0 || s.End < s.Start || s.Duration() > 20*time.Second {
			t.Errorf("implausible duration %v: %v", s.Duration(), s)
		}
	}
	if tp != "" {
		trace, parent := tp[3:35], tp[36:52]
		for _, s := range []Span{srv, cli} {
			if s.TraceID != trace || s.Parent != parent {
				t.Errorf("%s span did not join the traceparent %s: %v", s.Kind, tp, s)
			}
		}
		return srv, cli
	}
	if srv.Parent != cli.SpanID || srv.TraceID != cli.TraceID {
		t.Errorf("SERVER span's parent is not the CLIENT span on the same connection (server span starts %v after the client span):\n  %v\n  %v",
			time.Duration(int64(srv.Start)-int64(cli.Start)), srv, cli)
	}
	if cli.Parent != "" {
		t.Errorf("the driver has no inbound request, so its CLIENT span is a root: %v", cli)
	}
	within(t, srv, cli, "server span inside the client span")
	return srv, cli
}

// every span of a kernel run must come from one scenario's paths.
func checkNoStraySpans(t *testing.T, k *kernelRun, list []scenario, allowed func(path string) bool) {
	t.Helper()
	for _, s := range k.spans.all {
		p := s.Path()
		ok := false
		for _, sn := range list {
			if strings.HasPrefix(p, "/"+sn.name+"/") {
				ok = true
			}
		}
		if allowed != nil && allowed(p) {
			ok = true
		}
		if !ok || s.PID() != k.serverPID && s.PID() != k.driverPID {
			t.Errorf("stray span: %v", s)
		}
		for _, r := range p {
			if r < 0x21 || r > 0x7e {
				t.Errorf("span path with a non-printable byte: %q in %v", p, s)
				break
			}
		}
	}
}

func jsonUnmarshal(s string, v any) error {
	if strings.TrimSpace(s) == "null" {
		return nil
	}
	return json.Unmarshal([]byte(s), v)
}
