//go:build linux

package tls

import (
	"bufio"
	"bytes"
	ctls "crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/tls/testbpf"
)

// kernel is the test object loaded and its syscall programs attached.
type kernel struct {
	objs *testbpf.Objects
	rd   *ringbuf.Reader

	mu     sync.Mutex
	events []rawEvent
	links  map[string]link.Link // syscall tracepoint -> its link
	// drained counts the reader's reads that found the ring empty; ended
	// is set when the reader stops. Both under mu, signalled on idle.
	drained uint64
	ended   bool
	idle    *sync.Cond
}

type rawEvent struct {
	ev  testbpf.Event
	raw []byte
}

// A syscall tracepoint's program in the test object, its understudy and
// its gt_sys_tails slot, as internal/loader attaches them.
type syscallProgram struct {
	name        string
	slot        uint32
	prog, under *ebpf.Program
}

func syscallPrograms(o *testbpf.Objects) []syscallProgram {
	return []syscallProgram{
		{"sys_exit_read", loader.SysExitRead, o.GtExitRead, o.GtUsRead},
		{"sys_exit_recvfrom", loader.SysExitRecvfrom, o.GtExitRecvfrom, o.GtUsRecvfrom},
		{"sys_exit_readv", loader.SysExitReadv, o.GtExitReadv, o.GtUsReadv},
		{"sys_exit_recvmsg", loader.SysExitRecvmsg, o.GtExitRecvmsg, o.GtUsRecvmsg},
		{"sys_exit_write", loader.SysExitWrite, o.GtExitWrite, o.GtUsWrite},
		{"sys_exit_sendto", loader.SysExitSendto, o.GtExitSendto, o.GtUsSendto},
		{"sys_exit_writev", loader.SysExitWritev, o.GtExitWritev, o.GtUsWritev},
		{"sys_exit_sendmsg", loader.SysExitSendmsg, o.GtExitSendmsg, o.GtUsSendmsg},
		{"sys_enter_close", loader.SysEnterClose, o.GtEnterClose, o.GtUsClose},
	}
}

func loadKernel(t *testing.T) *kernel {
	t.Helper()
	return loadKernelWith(t, testbpf.Load)
}

func loadKernelWith(t *testing.T, load func() (*testbpf.Objects, error)) *kernel {
	t.Helper()
	requireRoot(t)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	objs, err := load()
	if err != nil {
		t.Fatalf("loading the TLS test object: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	links := map[string]link.Link{}
	for _, sp := range syscallPrograms(objs) {
		l, err := link.Tracepoint("syscalls", sp.name, sp.prog, nil)
		if err != nil {
			t.Fatalf("attaching %s: %v", sp.name, err)
		}
		links[sp.name] = l
	}
	t.Cleanup(func() {
		for _, l := range links {
			l.Close()
		}
	})
	rd, err := ringbuf.NewReader(objs.GtEvents)
	if err != nil {
		t.Fatal(err)
	}
	k := &kernel{objs: objs, rd: rd, links: links}
	k.idle = sync.NewCond(&k.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			k.mu.Lock()
			k.ended = true
			k.idle.Broadcast()
			k.mu.Unlock()
		}()
		for {
			// Records are submitted without a wakeup (gt_submit): poll.
			rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
			rec, err := rd.Read()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The ring was empty: every record made before this
				// read began has been taken.
				k.mu.Lock()
				k.drained++
				k.idle.Broadcast()
				k.mu.Unlock()
				continue
			}
			if err != nil {
				return
			}
			// Responses are the record's head alone (GT_HTTP_EVENT_HEAD: the fields
			// before Reward), or the head and the reward.
			// GenAI records are shorter: kept whole, taken by k.genai.
			if len(rec.RawSample) < int(unsafe.Offsetof(testbpf.Event{}.Reward)) && rec.RawSample[0] != testbpf.EvGenAI {
				continue
			}
			var e rawEvent
			e.raw = append([]byte(nil), rec.RawSample...)
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&e.ev)), unsafe.Sizeof(e.ev)), e.raw)
			k.mu.Lock()
			k.events = append(k.events, e)
			k.mu.Unlock()
		}
	}()
	t.Cleanup(func() { rd.Close(); <-done })
	return k
}

// logRunTime logs the TLS programs' average run time (needs sysctl
// kernel.bpf_stats_enabled=1).
func (k *kernel) logRunTime(t *testing.T) {
	for name, p := range map[string]*ebpf.Program{"rw_entry": k.objs.GtTlsRwEntry, "rw_ret": k.objs.GtTlsRwRet,
		"exit_sendto": k.objs.GtExitSendto, "exit_recvfrom": k.objs.GtExitRecvfrom} {
		st, err := p.Stats()
		if err == nil && st.RunCount > 0 {
			t.Logf("%-14s %7d runs %7d ns/run", name, st.RunCount, st.Runtime.Nanoseconds()/int64(st.RunCount))
		}
	}
}

func (k *kernel) programs() Programs {
	p := k.objs
	return Programs{RWEntry: p.GtTlsRwEntry, RWReturn: p.GtTlsRwRet, Handshake: p.GtTlsHandshake, Free: p.GtTlsFree}
}

// gate writes the config: mask enabled, http_client possible for clients,
// server for every role's inbound requests, and the config flags given.
func (k *kernel) gate(t *testing.T, mask groups.Mask, gen uint32, flags ...uint32) {
	t.Helper()
	var c testbpf.Config
	c.Mask = uint64(mask)
	for _, f := range flags {
		c.Flags |= f
	}
	c.ClientPossible = uint64(groups.HTTPClient.Mask())
	for i := range c.ServerPossible {
		c.ServerPossible[i] = uint64(groups.Server.Mask())
	}
	c.Generation = gen
	if err := k.objs.GtConfig.Put(uint32(0), &c); err != nil {
		t.Fatal(err)
	}
}

func (k *kernel) target(t *testing.T, pid int) {
	t.Helper()
	if err := k.objs.GtTargets.Put(uint32(pid), testbpf.Target{}); err != nil {
		t.Fatal(err)
	}
	word := uint32(pid >> 6)
	var bits uint64
	_ = k.objs.GtTargetBits.Lookup(word, &bits)
	bits |= 1 << (pid & 63)
	if err := k.objs.GtTargetBits.Put(word, bits); err != nil {
		t.Fatal(err)
	}
}

func (k *kernel) stat(t *testing.T, slot uint32) uint64 {
	t.Helper()
	var per []uint64
	if err := k.objs.GtStats.Lookup(slot, &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

// take returns (and forgets) the events of pid made so far: it waits until
// a read that began after the call found the ring empty (two empty reads
// from now: the first may have begun before), however long a busy machine
// keeps the reader from running.
func (k *kernel) take(pid int) []rawEvent {
	k.mu.Lock()
	defer k.mu.Unlock()
	for from := k.drained; k.drained < from+2 && !k.ended; {
		k.idle.Wait()
	}
	var out, rest []rawEvent
	for _, e := range k.events {
		if int(e.ev.Pid) == pid {
			out = append(out, e)
		} else {
			rest = append(rest, e)
		}
	}
	k.events = rest
	return out
}

// upstream is a local HTTPS server shaped like an OpenAI-compatible
// endpoint: POST /v1/chat/completions streams three SSE events 60 ms apart
// (chunked), /v1/responses answers upstreamResponses, anything else a fixed
// JSON body.
type upstream struct {
	srv      *httptest.Server
	port     int
	ca       string
	streamed time.Duration

	mu       sync.Mutex
	lastPart []uint64 // CLOCK_MONOTONIC just before each stream's last event was written
}

// lastPartAfter is the first stream's last-event time at or after t (the
// request's start), 0 when none.
func (u *upstream) lastPartAfter(t uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var best uint64
	for _, v := range u.lastPart {
		if v >= t && (best == 0 || v < best) {
			best = v
		}
	}
	return best
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	kp, err := ctls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ca: cert, streamed: 120 * time.Millisecond}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/responses" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(upstreamResponses))
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok": true}`))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < 3; i++ {
			if i > 0 {
				time.Sleep(u.streamed / 2)
			}
			if i == 2 {
				var ts unix.Timespec
				_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
				u.mu.Lock()
				u.lastPart = append(u.lastPart, uint64(ts.Nano()))
				u.mu.Unlock()
			}
			fmt.Fprintf(w, "data: {\"delta\": \"part %d\"}\n\n", i)
			fl.Flush()
		}
	})
	u.srv = httptest.NewUnstartedServer(h)
	u.srv.TLS = &ctls.Config{Certificates: []ctls.Certificate{kp}, NextProtos: []string{"http/1.1"}}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	u.port = u.srv.Listener.Addr().(*net.TCPAddr).Port
	return u
}

func (u *upstream) url(path string) string {
	return fmt.Sprintf("https://127.0.0.1:%d%s", u.port, path)
}

// pyClient is testdata/client.py, waiting for commands.
type pyClient struct {
	pid int
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPyClient(t *testing.T, ca string) *pyClient {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "testdata/client.py", ca)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Skipf("starting /usr/bin/python3: %v", err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	c := &pyClient{pid: cmd.Process.Pid, in: in, out: bufio.NewScanner(out)}
	c.expect(t, "ready")
	return c
}

func (c *pyClient) do(t *testing.T, line, want string) string {
	t.Helper()
	fmt.Fprintln(c.in, line)
	return c.expect(t, want)
}

func (c *pyClient) expect(t *testing.T, prefix string) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("the python client exited (waiting for %q)", prefix)
	}
	if !strings.HasPrefix(c.out.Text(), prefix) {
		t.Fatalf("python client said %q, want %q...", c.out.Text(), prefix)
	}
	return c.out.Text()
}

func hasLib(libs []Library, sub string) bool {
	for _, l := range libs {
		if strings.Contains(l.Path, sub) {
			return true
		}
	}
	return false
}

// checkExchanges asserts n client exchanges of POST path over TLS against
// the upstream, with the SSE stream's true end, and no secret anywhere.
func checkExchanges(t *testing.T, evs []rawEvent, u *upstream, n int, path string, streamed bool) {
	t.Helper()
	var reqs, resps []testbpf.Event
	for _, e := range evs {
		if bytes.Contains(e.raw, []byte("TOPSECRET")) {
			t.Errorf("a kernel record contains the bearer token or body: %q", e.raw)
		}
		switch e.ev.Kind {
		case testbpf.EvRequest:
			reqs = append(reqs, e.ev)
		case testbpf.EvResponse:
			resps = append(resps, e.ev)
		case testbpf.EvClose:
			t.Errorf("unexpected close record (conn %d)", e.ev.ConnId)
		}
	}
	if len(reqs) != n || len(resps) != n {
		t.Fatalf("%d requests and %d responses, want %d of each", len(reqs), len(resps), n)
	}
	for i := range reqs {
		q, r := reqs[i], resps[i]
		p := string(q.Path[:q.PathLen])
		host := string(q.Host[:q.HostLen])
		t.Logf("request %d: conn %d method %d path %s host %s flags %#x rport %d; response status %d flags %#x, %v",
			i, q.ConnId, q.Method, p, host, q.Flags, q.Tuple.Rport, r.Status, r.Flags,
			time.Duration(r.EndNs-q.StartNs))
		if q.Flags&testbpf.FlagTLS == 0 || r.Flags&testbpf.FlagTLS == 0 {
			t.Errorf("records lack GT_F_TLS: %#x %#x", q.Flags, r.Flags)
		}
		if q.Method != 2 || p != path || q.Side != 2 {
			t.Errorf("request: method %d side %d path %q, want POST client %s", q.Method, q.Side, p, path)
		}
		if !strings.HasSuffix(host, fmt.Sprint(u.port)) {
			t.Errorf("Host %q does not name the upstream port %d", host, u.port)
		}
		if int(q.Tuple.Rport) != u.port || r.ConnId != q.ConnId {
			t.Errorf("request tuple rport %d (want %d: SSL* not linked to its socket), response conn %d vs %d",
				q.Tuple.Rport, u.port, r.ConnId, q.ConnId)
		}
		if r.Status != 200 {
			t.Errorf("status %d", r.Status)
		}
		if streamed {
			if r.Flags&(testbpf.FlagChunked|testbpf.FlagEndByClose) == 0 {
				t.Errorf("response neither chunked nor ended by close: %#x", r.Flags)
			}
			// Its end is the last event's read, which cannot come before
			// the server wrote it (a causal order, not a duration: the
			// client may read late on a busy machine).
			if last := u.lastPartAfter(q.StartNs); last == 0 || r.EndNs < last {
				t.Errorf("response ended at %d, before the stream's last event was written (%d): not its true end", r.EndNs, last)
			}
		}
	}
}

// withUpstream loads the test object and starts the HTTPS upstream and an
// attacher for the TLS programs (closed at the test's end).
func withUpstream(t *testing.T) (*kernel, *upstream, *Attacher) {
	t.Helper()
	k := loadKernel(t)
	u := startUpstream(t)
	a, err := NewAttacher(k.programs(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return k, u, a
}

func TestKernel(t *testing.T) {
	k, u, a := withUpstream(t)
	k.gate(t, groups.MaskOf(groups.Server, groups.HTTPClient), 1)

	t.Run("aiohttp", func(t *testing.T) {
		py := startPyClient(t, u.ca)
		k.target(t, py.pid)
		py.do(t, "import", "imported")
		if err := a.Add(py.pid); err != nil {
			t.Fatal(err)
		}
		if libs := a.Libraries(py.pid); !hasLib(libs, "libssl") {
			t.Fatalf("libssl not attached: %+v", libs)
		}
		linked := k.stat(t, testbpf.StatTLSLinked)
		py.do(t, "aiohttp "+u.url("/v1/chat/completions")+" 3", "done 200")
		checkExchanges(t, k.take(py.pid), u, 3, "/v1/chat/completions", true)
		if d := k.stat(t, testbpf.StatTLSLinked) - linked; d != 1 {
			t.Errorf("%d SSL objects linked, want 1 (one keep-alive connection)", d)
		}
		if os.Getenv("GYMTRACE_TLS_COST") != "" {
			k.logRunTime(t)
			py.do(t, "aiohttp "+u.url("/json")+" 300", "done 200")
			k.logRunTime(t)
			k.take(py.pid)
			plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = w.Write([]byte(`{"ok": true}`))
			}))
			defer plain.Close()
			t.Log("plain HTTP, same load:")
			py.do(t, "aiohttp "+plain.URL+"/json 300", "done 200")
			k.logRunTime(t)
			k.take(py.pid)
		}
	})

	t.Run("urllib", func(t *testing.T) {
		py := startPyClient(t, u.ca)
		k.target(t, py.pid)
		py.do(t, "import", "imported")
		if err := a.Add(py.pid); err != nil {
			t.Fatal(err)
		}
		py.do(t, "urllib "+u.url("/v1/chat/completions")+" 2", "done 200")
		checkExchanges(t, k.take(py.pid), u, 2, "/v1/chat/completions", true)
	})

	t.Run("lazy import", func(t *testing.T) {
		py := startPyClient(t, u.ca)
		k.target(t, py.pid)
		if err := a.Add(py.pid); err != nil {
			t.Fatal(err)
		}
		if libs := a.Libraries(py.pid); len(libs) != 0 {
			t.Fatalf("attached before ssl was imported: %+v", libs)
		}
		py.do(t, "import", "imported")
		a.Rescan()
		if libs := a.Libraries(py.pid); !hasLib(libs, "libssl") {
			t.Fatalf("libssl not attached after the lazy import: %+v", libs)
		}
		py.do(t, "aiohttp "+u.url("/json")+" 1", "done 200")
		checkExchanges(t, k.take(py.pid), u, 1, "/json", false)
	})

	t.Run("gate off", func(t *testing.T) {
		// http_client off: the probes still run (server is on) but no
		// client plaintext is parsed or emitted.
		k.gate(t, groups.MaskOf(groups.Server), 2)
		defer k.gate(t, groups.MaskOf(groups.Server, groups.HTTPClient), 3)
		py := startPyClient(t, u.ca)
		k.target(t, py.pid)
		py.do(t, "import", "imported")
		if err := a.Add(py.pid); err != nil {
			t.Fatal(err)
		}
		before := k.stat(t, testbpf.StatTLSEvents)
		py.do(t, "aiohttp "+u.url("/v1/chat/completions")+" 2", "done 200")
		if evs := k.take(py.pid); len(evs) != 0 {
			t.Errorf("%d records with http_client off", len(evs))
		}
		if d := k.stat(t, testbpf.StatTLSEvents) - before; d != 0 {
			t.Errorf("%d TLS records emitted with http_client off", d)
		}

		// Disabled: nothing attached, no probe runs at all.
		a.SetEnabled(false)
		defer a.SetEnabled(true)
		if libs := a.Libraries(py.pid); len(libs) != 0 {
			t.Fatalf("still attached while disabled: %+v", libs)
		}
		calls := k.stat(t, testbpf.StatTLSCalls)
		py.do(t, "aiohttp "+u.url("/v1/chat/completions")+" 1", "done 200")
		if d := k.stat(t, testbpf.StatTLSCalls) - calls; d != 0 {
			t.Errorf("%d TLS probe runs while disabled", d)
		}
	})

	for _, version := range []string{"1.1", "1.0"} {
		t.Run("static executable HTTP/"+version, func(t *testing.T) { staticClient(t, k, a, u, version) })
	}
}

// staticClient runs testdata/static_client.c, OpenSSL linked statically, with
// the probes placed on the executable itself.
func staticClient(t *testing.T, k *kernel, a *Attacher, u *upstream, version string) {
	bin := filepath.Join(t.TempDir(), "static_client")
	out, err := exec.Command("gcc", "-O2", "-static", "-o", bin, "testdata/static_client.c",
		"-lssl", "-lcrypto", "-lpthread").CombinedOutput()
	if err != nil {
		t.Skipf("building a static OpenSSL client (needs gcc, libssl-dev): %v\n%s", err, out)
	}
	// It waits for a line on stdin, so the probes are in place first.
	cmd := exec.Command(bin, fmt.Sprint(u.port), u.ca, "2", version)
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("static client did not start: %q", sc.Text())
	}
	pid := cmd.Process.Pid
	k.target(t, pid)
	if err := a.Add(pid); err != nil {
		t.Fatal(err)
	}
	libs := a.Libraries(pid)
	if len(libs) != 1 || !libs[0].Static {
		t.Fatalf("static OpenSSL not attached: %+v", libs)
	}
	t.Logf("static sites: read %s (emulated %v), write %s (emulated %v)", libs[0].Sites.Read.Symbol,
		libs[0].Sites.Read.Cheap, libs[0].Sites.Write.Symbol, libs[0].Sites.Write.Cheap)
	fmt.Fprintln(in, "go")
	for sc.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("static client: %v", err)
	}
	a.Remove(pid)
	evs := k.take(pid)
	checkExchanges(t, evs, u, 2, "/v1/chat/completions", true)
	for _, e := range evs {
		if version == "1.0" && e.ev.Kind == testbpf.EvResponse && e.ev.Flags&testbpf.FlagEndByClose == 0 {
			t.Errorf("HTTP/1.0 response not ended by SSL_free: flags %#x", e.ev.Flags)
		}
	}
}
