//go:build linux

package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// supervised is a supervisor process (gymtrace's --pid target) that keeps
// one HTTP server child running on a fixed address.
type supervised struct {
	*proc
	addr string
	seen int // "child" lines consumed
}

func startSupervisor(t *testing.T) *supervised {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startProc(t, "supervisor", []string{selfBin}, childEnv+"=supervisor", "GT_REL_ADDR="+addr)
	return &supervised{proc: p, addr: addr}
}

// nextChild waits for the supervisor's next "child PID" line and for that
// child to listen.
func (s *supervised) nextChild(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var pids []int
		for _, line := range strings.Split(s.Stdout.String(), "\n") {
			if v, ok := strings.CutPrefix(line, "child "); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					pids = append(pids, n)
				}
			}
		}
		if len(pids) > s.seen {
			s.seen++
			pid := pids[s.seen-1]
			for time.Now().Before(deadline) {
				if c, err := net.DialTimeout("tcp", s.addr, time.Second); err == nil {
					c.Close()
					return pid
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Fatalf("the supervisor's child %d does not listen on %s", pid, s.addr)
		}
		if s.Exited() || time.Now().After(deadline) {
			t.Fatalf("the supervisor started no new child (exited: %v); stderr:\n%s", s.Exited(), tail(s.Stderr.String(), 2048))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// connKey mirrors struct gt_conn_key (bpf/common/conn.h).
type connKey struct {
	Tgid uint32
	Fd   int32
}

// connEntries reads gymtrace's gt_conns map (found through its fds, so other
// gymtrace instances on the host do not count): tgid -> entries, and the
// map's capacity.
func connEntries(t *testing.T, gtPID int) (map[uint32]int, uint32) {
	t.Helper()
	_, maps, err := bpfObjects(gtPID)
	if err != nil {
		t.Fatal(err)
	}
	for id := range maps {
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			continue
		}
		info, err := m.Info()
		if err != nil || info.Name != "gt_conns" {
			m.Close()
			continue
		}
		defer m.Close()
		out := map[uint32]int{}
		var prev any // nil: the first key
		for range 1 << 20 {
			var next connKey
			if err := m.NextKey(prev, &next); err != nil {
				if !errors.Is(err, ebpf.ErrKeyNotExist) {
					t.Fatalf("walking gt_conns: %v", err)
				}
				break
			}
			out[next.Tgid]++
			prev = next
		}
		return out, m.MaxEntries()
	}
	t.Fatalf("gymtrace (pid %d) holds no gt_conns map", gtPID)
	return nil, 0
}

// TestTargetCrashRestart kills a traced server with SIGKILL mid-traffic; its
// supervisor (the --pid target) restarts it under a new PID, which must be
// traced at once; the dead server's connections must leave the kernel's
// connection table.
func TestTargetCrashRestart(t *testing.T) {
	needRoot(t)
	sup := startSupervisor(t)
	first := sup.nextChild(t)
	g := startGymtrace(t, gtOpts{pids: []int{sup.Pid()}})
	// The child existed before gymtrace: it is traced as the supervisor's
	// child only if forked later. Restart it once so the traced one is new.
	syscall.Kill(first, syscall.SIGKILL)
	fmt.Fprintln(sup.Stdin)
	p1 := sup.nextChild(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := load(ctx, "http://"+sup.addr+"/traffic", 4, 2*time.Millisecond)
	waitSpan(t, g.jsonl, 30*time.Second, fmt.Sprintf("from the supervisor's child %d", p1),
		func(s span) bool { return s.pid() == p1 })
	before, capacity := connEntries(t, g.Pid())

	// Crash mid-traffic: open keep-alive connections die with the process
	// (no close(2): the kernel closes its files at exit).
	if err := syscall.Kill(p1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	fmt.Fprintln(sup.Stdin)
	p2 := sup.nextChild(t)
	marker := uniquePath("after-restart")
	get(t, "http://"+sup.addr+marker)
	sp := waitSpan(t, g.jsonl, 30*time.Second, fmt.Sprintf("%s from the restarted server %d", marker, p2),
		func(s span) bool { return s.path() == marker })
	if sp.pid() != p2 {
		t.Errorf("span for %s has process.pid %d, want the restarted server's %d", marker, sp.pid(), p2)
	}
	traced := time.Since(killed)
	cancel()
	t.Logf("workload during the crash: %s (errors are the crash's own)", res)

	// No connection state of the dead process stays behind.
	var stale int
	for wait := time.Now().Add(30 * time.Second); ; { // a bound on a failure, not a timing
		after, _ := connEntries(t, g.Pid())
		stale = after[uint32(p1)]
		if stale == 0 || time.Now().After(wait) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if stale != 0 {
		t.Errorf("gt_conns still holds %d entries of the killed process %d 30 s after its death (it had %d; capacity %d): "+
			"connection state of crashed targets is not cleaned on exit (their sockets close in the kernel, without close(2)), it waits for LRU eviction and takes table space from live connections",
			stale, p1, before[uint32(p1)], capacity)
	}
	g.terminate(t)
	t.Logf("server %d killed, restarted as %d, its first request traced %v after the kill; gt_conns entries of the dead pid: %d before, %d after (capacity %d)",
		p1, p2, traced.Round(time.Millisecond), before[uint32(p1)], stale, capacity)
}

// TestPIDReuse restarts a killed server under the very same PID (through
// ns_last_pid) while the kernel may still hold the old process's connection
// state: the new process's requests must be traced, with their own
// addresses.
func TestPIDReuse(t *testing.T) {
	needRoot(t)
	// Writing the current value back changes nothing but proves we may.
	last, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
	if err == nil {
		err = os.WriteFile("/proc/sys/kernel/ns_last_pid", last, 0)
	}
	if err != nil {
		t.Skipf("cannot choose PIDs here (writing /proc/sys/kernel/ns_last_pid: %v)", err)
	}
	sup := startSupervisor(t)
	first := sup.nextChild(t)
	g := startGymtrace(t, gtOpts{pids: []int{sup.Pid()}})
	syscall.Kill(first, syscall.SIGKILL)
	fmt.Fprintln(sup.Stdin)
	p1 := sup.nextChild(t)

	// Keep-alive connections that are open when the server dies.
	ctx, cancel := context.WithCancel(context.Background())
	res := load(ctx, "http://"+sup.addr+"/old", 8, 20*time.Millisecond)
	waitSpan(t, g.jsonl, 30*time.Second, "from the first server", func(s span) bool { return s.pid() == p1 })
	time.Sleep(300 * time.Millisecond)
	syscall.Kill(p1, syscall.SIGKILL)
	cancel()
	_ = res
	fmt.Fprintf(sup.Stdin, "pid %d\n", p1)
	p2 := sup.nextChild(t)
	if p2 != p1 {
		t.Skipf("could not get PID %d again for the restarted server (got %d): other processes took it", p1, p2)
	}
	stale, _ := connEntries(t, g.Pid())

	// New connections to the new process: each span must carry its own
	// connection's client port, not a dead connection's.
	var bad []string
	const n = 8
	for i := range n {
		path := uniquePath(fmt.Sprintf("reused-%d", i))
		c, err := net.DialTimeout("tcp", sup.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		port := c.LocalAddr().(*net.TCPAddr).Port
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, sup.addr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d to the restarted server: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		c.Close()
		deadline := time.Now().Add(30 * time.Second) // a bound on a failure
		var got *span
		for got == nil && time.Now().Before(deadline) {
			for _, s := range readSpans(t, g.jsonl) {
				if s.path() == path {
					got = &s
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		switch {
		case got == nil:
			bad = append(bad, fmt.Sprintf("%s: no span", path))
		case got.pid() != p2:
			bad = append(bad, fmt.Sprintf("%s: process.pid %d", path, got.pid()))
		case int(attrNum(got.Attributes, "client.port")) != port:
			bad = append(bad, fmt.Sprintf("%s: client.port %v, the connection's is %d (a dead connection's state?)", path, got.Attributes["client.port"], port))
		}
	}
	if len(bad) > 0 {
		t.Errorf("PID %d reused with %d stale gt_conns entries of its previous process: %d of %d requests traced wrongly:\n  %s",
			p1, stale[uint32(p1)], len(bad), n, strings.Join(bad, "\n  "))
	}
	g.terminate(t)
	t.Logf("PID %d reused; stale gt_conns entries at restart: %d; %d/%d requests traced correctly", p1, stale[uint32(p1)], n-len(bad), n)
}

func attrNum(m map[string]any, k string) float64 {
	f, _ := m[k].(float64)
	return f
}

// forkServer is a Python HTTP server that forks after a line on stdin: the
// child serves, the parent (gymtrace's --pid target) only waits, as a
// pre-fork worker model does.
const forkServer = `
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        b = b"ok %d\n" % os.getpid()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print("listening 127.0.0.1:%d" % srv.server_address[1], flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    srv.serve_forever()
print("child %d" % pid, flush=True)
os.waitpid(pid, 0)
`

// TestForkedWorkerTraced: a target forks a worker after gymtrace attached;
// the worker's requests are traced under its own PID.
func TestForkedWorkerTraced(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat(python); err != nil {
		t.Skipf("needs %s: %v", python, err)
	}
	script := filepath.Join(t.TempDir(), "forkserver.py")
	if err := os.WriteFile(script, []byte(forkServer), 0o644); err != nil {
		t.Fatal(err)
	}
	parent := startProc(t, "fork server", []string{python, script})
	line := parent.WaitOutput(t, false, "listening ", 10*time.Second)
	addr := strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	g := startGymtrace(t, gtOpts{pids: []int{parent.Pid()}})
	fmt.Fprintln(parent.Stdin)
	child, _ := strconv.Atoi(strings.TrimPrefix(parent.WaitOutput(t, false, "child ", 10*time.Second), "child "))

	path := uniquePath("forked")
	get(t, "http://"+addr+path)
	sp := waitSpan(t, g.jsonl, 30*time.Second, fmt.Sprintf("for %s served by the forked worker %d", path, child),
		func(s span) bool { return s.path() == path })
	if sp.pid() != child {
		t.Errorf("span for %s has process.pid %d, want the worker's %d", path, sp.pid(), child)
	}
	g.terminate(t)
	t.Logf("worker %d (forked by target %d after attach) traced: %q service %v", child, parent.Pid(), sp.Name, sp.Resource["service.name"])
}
