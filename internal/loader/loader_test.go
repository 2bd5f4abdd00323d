//go:build linux

package loader

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// These tests load the real BPF objects and drive the kernel HTTP parser with
// real sockets inside the test process, which is its own target: every
// message is seen twice, once as written by one end and once as read by the
// other.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_PERFMON) to load BPF programs: run go test as root")
	}
	if _, err := os.Stat("/sys/kernel/tracing/events/syscalls"); err != nil {
		t.Skip("needs tracefs mounted at /sys/kernel/tracing (sudo ./scripts/setup mounts it)")
	}
}

const allGroups = 1<<11 - 1

type rig struct {
	t   *testing.T
	tr  *Tracer
	mu  sync.Mutex
	evs []HTTPEvent
	ga  []GenAIEvent // GenAI records (genai_test.go)
	// drains counts the reader's drains that left the ring empty; ended is
	// set when the reader stops. Both under mu, signalled on idle.
	drains uint64
	ended  bool
	idle   *sync.Cond
}

// loadSelf loads the programs with the gate set to mask (every group
// possible on both sides) and the test process as the only target.
func loadSelf(t *testing.T, mask uint64) *Tracer {
	t.Helper()
	return loadSelfWith(t, mask, Options{})
}

// loadSelfWith is loadSelf with the given load options.
func loadSelfWith(t *testing.T, mask uint64, opts Options) *Tracer {
	t.Helper()
	needRoot(t)
	tr, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	var sp [8]uint64
	for i := range sp {
		sp[i] = allGroups
	}
	if err := tr.SetGate(mask, sp, allGroups, 0); err != nil {
		t.Fatal(err)
	}
	if err := tr.AddTarget(os.Getpid(), RoleUnknown); err != nil {
		t.Fatal(err)
	}
	return tr
}

func newRig(t *testing.T, mask uint64) *rig {
	tr := loadSelf(t, mask)
	r := &rig{t: t, tr: tr}
	tr.pollEvery = 10 * time.Millisecond // settle waits for two drains
	r.idle = sync.NewCond(&r.mu)
	tr.drained = func() {
		r.mu.Lock()
		r.drains++
		r.idle.Broadcast()
		r.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			r.mu.Lock()
			r.ended = true
			r.idle.Broadcast()
			r.mu.Unlock()
		}()
		_ = tr.Read(ctx, func(raw []byte) {
			if len(raw) >= GenAIEventSize && raw[0] == EvGenAI {
				var ga GenAIEvent
				copy(unsafe.Slice((*byte)(unsafe.Pointer(&ga)), GenAIEventSize), raw)
				r.mu.Lock()
				r.ga = append(r.ga, ga)
				r.mu.Unlock()
				return
			}
			if len(raw) < HTTPEventHeadSize || IsProcEvent(raw[0]) {
				return
			}
			// Responses and closes are the head alone (GT_HTTP_EVENT_HEAD).
			var ev HTTPEvent
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), HTTPEventSize), raw)
			r.mu.Lock()
			r.evs = append(r.evs, ev)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// waitFor waits until n events matching f arrived, or the reader has
// emptied the ring twice since the call (the first drain may have begun
// before it) and 3 s have passed, then returns the matching events. The
// drains make it wait however long a busy machine keeps the reader from
// running; the 3 s is for records whose syscall has not returned yet (a
// server's answer can reach its client before the server's write returns).
// Callers that must see everything their own syscalls made use settle.
func (r *rig) waitFor(n int, f func(*HTTPEvent) bool) []HTTPEvent {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	r.mu.Lock()
	from := r.drains
	r.mu.Unlock()
	for {
		r.mu.Lock()
		caughtUp := r.drains >= from+2 || r.ended // read before the events: a drain after this read counts next time
		r.mu.Unlock()
		out := r.events(f)
		if len(out) >= n || caughtUp && time.Now().After(deadline) {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle returns once the reader has delivered every record in the ring at
// the time of the call: after two drains that left it empty (the first may
// have begun before the call).
func (r *rig) settle() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for from := r.drains; r.drains < from+2 && !r.ended; {
		r.idle.Wait()
	}
}

// events returns the events matching f read so far.
func (r *rig) events(f func(*HTTPEvent) bool) []HTTPEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []HTTPEvent
	for i := range r.evs {
		if f(&r.evs[i]) {
			out = append(out, r.evs[i])
		}
	}
	return out
}

// connRecords describes, for a finding, the records read on connection c
// (kind/side), the kernel's count of records the ring had no room for, and
// the runs of the programs the kernel skipped (recursion misses: a skipped
// syscall program makes no record).
func (r *rig) connRecords(c net.Conn) string {
	var parts []string
	for _, side := range []uint8{SideClient, SideServer} {
		for _, kind := range []uint8{EvRequest, EvResponse, EvClose} {
			if n := len(r.events(onConn(c, kind, side))); n > 0 {
				parts = append(parts, fmt.Sprintf("kind %d side %d: %d", kind, side, n))
			}
		}
	}
	skipped := SkippedRunsBy(LoadedPrograms(r.tr.Programs()))
	return fmt.Sprintf("records on the connection: [%s]; ring full %d; program runs skipped: [%s]",
		strings.Join(parts, ", "), r.stats()[StatRingbufFull], strings.Join(skipped, " "))
}

func (r *rig) stats() []uint64 {
	st, err := r.tr.Stats()
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

func path(e *HTTPEvent) string { return string(e.Path[:e.PathLen]) }

func kindSide(kind, side uint8) func(*HTTPEvent) bool {
	return func(e *HTTPEvent) bool { return e.Kind == kind && e.Side == side }
}

// server accepts one connection and hands it to fn.
func server(t *testing.T, fn func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fn(c)
	}()
	return ln.Addr().String()
}

// dialAnswering dials a server that answers n requests (n < 0: every one
// until the client closes) with resp each, and returns the client's
// connection (closed at the test's end).
func dialAnswering(t *testing.T, n int, resp string) net.Conn {
	t.Helper()
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; n < 0 || i < n; i++ {
			if _, err := readRequest(br); err != nil {
				return
			}
			writeAll(t, c, resp)
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readRequest consumes one request (headers + Content-Length body).
func readRequest(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	cl := 0
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		if h == "\r\n" {
			break
		}
		if strings.HasPrefix(strings.ToLower(h), "content-length:") {
			fmt.Sscanf(strings.TrimSpace(h[15:]), "%d", &cl)
		}
	}
	_, err = io.CopyN(io.Discard, br, int64(cl))
	return line, err
}

func writeAll(t *testing.T, c net.Conn, parts ...string) {
	for _, p := range parts {
		if _, err := c.Write([]byte(p)); err != nil {
			t.Error(err)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKeepAliveRequestsPairOnBothEnds(t *testing.T) {
	r := newRig(t, allGroups)
	c := dialAnswering(t, 3, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	br := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		writeAll(t, c, fmt.Sprintf("POST /v1/responses?secret=x HTTP/1.1\r\nHost: model:8000\r\nContent-Length: 2\r\n\r\n{}"))
		resp := make([]byte, len("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
		if _, err := io.ReadFull(br, resp); err != nil {
			t.Fatal(err)
		}
	}
	srvReq := r.waitFor(3, kindSide(EvRequest, SideServer))
	cliResp := r.waitFor(3, kindSide(EvResponse, SideClient))
	if len(srvReq) != 3 || len(cliResp) != 3 {
		t.Fatalf("server requests %d, client responses %d; want 3 and 3", len(srvReq), len(cliResp))
	}
	for i, e := range srvReq {
		if path(&e) != "/v1/responses" || e.Method != MethodPOST || e.BodyLen != 2 {
			t.Errorf("request %d: path %q method %d body %d; want /v1/responses (query stripped), POST, 2", i, path(&e), e.Method, e.BodyLen)
		}
		if host := string(e.Host[:e.HostLen]); host != "model:8000" {
			t.Errorf("request %d: host %q", i, host)
		}
	}
	for _, e := range cliResp {
		if e.Status != 200 || e.BodyLen != 5 {
			t.Errorf("client response: status %d body %d; want 200, 5", e.Status, e.BodyLen)
		}
	}
	// Both ends of one connection see mirrored tuples.
	s, cl := srvReq[0].Tuple, r.waitFor(1, kindSide(EvRequest, SideClient))[0].Tuple
	if s.Lport != cl.Rport || s.Rport != cl.Lport || s.Laddr != cl.Raddr {
		t.Errorf("tuples do not mirror: server %+v client %+v", s, cl)
	}
	// Each message's start, path and header block came from one read: 3
	// requests and 3 responses, on both ends.
	st, err := r.tr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if got := st[StatScanPreread]; got < 12 {
		t.Errorf("%d header blocks scanned from the read at their message start, want 12", got)
	}
}

func TestSplitRequestAndLateTraceparent(t *testing.T) {
	r := newRig(t, allGroups)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequest(br); err != nil {
			return
		}
		writeAll(t, c, "HTTP/1.1 204 No Content\r\n\r\n")
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Request line, then headers in two writes (traceparent in the second
	// read of the header block), then the body.
	writeAll(t, c, "POST /verify HTTP/1.1\r\n", "Host: res\r\nContent-Type: application/json\r\n",
		"traceparent: "+tp+"\r\nContent-Length: 11\r\n\r\n", `{"ok":true}`)
	_, _ = bufio.NewReader(c).ReadString('\n')
	got := r.waitFor(1, kindSide(EvRequest, SideServer))
	if len(got) != 1 {
		t.Fatalf("server requests: %d, want 1", len(got))
	}
	e := got[0]
	if path(&e) != "/verify" || e.BodyLen != 11 || e.Flags&FlagTraceparent == 0 || string(e.Traceparent[:55]) != tp {
		t.Errorf("got path %q body %d flags %#x tp %q", path(&e), e.BodyLen, e.Flags, e.Traceparent[:55])
	}
	if resp := r.waitFor(1, kindSide(EvResponse, SideServer)); len(resp) != 1 || resp[0].Status != 204 {
		t.Errorf("204 response not seen or wrong: %+v", resp)
	}
}

// A request line written in pieces, the first ending inside the path: the
// server's first read holds "POST /v" only. That is not the path: the
// record says so (FlagPathTruncated), and the exchange still pairs with its
// response.
func TestRequestLineSplitInPath(t *testing.T) {
	r := newRig(t, allGroups)
	c := dialAnswering(t, 2, "HTTP/1.1 204 No Content\r\n\r\n")
	br := bufio.NewReader(c)
	writeAll(t, c, "POST /v", "erify HTTP/1.1\r\nHost: res\r\nContent-Length: 11\r\n\r\n", `{"ok":true}`)
	br.ReadString('\n')
	br.ReadString('\n')
	writeAll(t, c, "POST /verify HTTP/1.1\r\nHost: res\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	got := r.waitFor(2, kindSide(EvRequest, SideServer))
	if len(got) != 2 {
		t.Fatalf("server requests: %d, want 2", len(got))
	}
	if got[0].Flags&FlagPathTruncated == 0 || got[0].BodyLen != 11 {
		t.Errorf("split request line: path %q flags %#x body %d; want FlagPathTruncated and body 11", path(&got[0]), got[0].Flags, got[0].BodyLen)
	}
	if path(&got[1]) != "/verify" || got[1].Flags&FlagPathTruncated != 0 {
		t.Errorf("next request: path %q flags %#x; want /verify, whole", path(&got[1]), got[1].Flags)
	}
	if resp := r.waitFor(2, kindSide(EvResponse, SideServer)); len(resp) != 2 || resp[0].Status != 204 {
		t.Errorf("responses: %d, want two 204s", len(resp))
	}
}

func TestChunkedResponseEndsAtLastChunk(t *testing.T) {
	r := newRig(t, allGroups)
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequest(br); err != nil {
			return
		}
		writeAll(t, c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
		for i := 0; i < 20; i++ {
			d := fmt.Sprintf("data: {\"delta\": %d}\n\n", i)
			writeAll(t, c, fmt.Sprintf("%x\r\n%s\r\n", len(d), d))
		}
		writeAll(t, c, "0\r\n\r\n")
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeAll(t, c, "POST /v1/chat/completions HTTP/1.1\r\nHost: m\r\nContent-Length: 2\r\n\r\n{}")
	buf := make([]byte, 64<<10)
	var all []byte
	for !strings.HasSuffix(string(all), "0\r\n\r\n") {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, buf[:n]...)
	}
	for _, side := range []uint8{SideServer, SideClient} {
		got := r.waitFor(1, kindSide(EvResponse, side))
		if len(got) != 1 {
			t.Fatalf("side %d: %d responses, want 1", side, len(got))
		}
		e := got[0]
		if e.Flags&FlagChunked == 0 || e.Flags&FlagBodyUnknown != 0 {
			t.Errorf("side %d: flags %#x: want chunked with framing followed", side, e.Flags)
		}
		if e.EndNs-e.StartNs < uint64(80*time.Millisecond) {
			t.Errorf("side %d: response lasted %v; the 20 chunks took >= 100ms, so it ended early", side, time.Duration(e.EndNs-e.StartNs))
		}
	}
}

func TestLargeBodiesAndPipelining(t *testing.T) {
	r := newRig(t, allGroups)
	big := strings.Repeat("x", 1<<20)
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; i < 3; i++ {
			if _, err := readRequest(br); err != nil {
				return
			}
		}
		// Responses only after all three requests: pipelining.
		for i := 0; i < 2; i++ {
			writeAll(t, c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		writeAll(t, c, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(big)), big)
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Two requests in one write, then a 1 MiB body.
	writeAll(t, c, "GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n",
		fmt.Sprintf("POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", len(big)), big)
	small := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	want := 2*len(small) + len(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(big))) + len(big)
	got := 0
	buf := make([]byte, 1<<16)
	for got < want {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	reqs := r.waitFor(3, kindSide(EvRequest, SideServer))
	if len(reqs) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(reqs))
	}
	for i, wantPath := range []string{"/a", "/b", "/c"} {
		if path(&reqs[i]) != wantPath {
			t.Errorf("request %d: %q, want %q", i, path(&reqs[i]), wantPath)
		}
	}
	if reqs[2].BodyLen != uint64(len(big)) {
		t.Errorf("1 MiB request body counted as %d", reqs[2].BodyLen)
	}
	resps := r.waitFor(3, kindSide(EvResponse, SideClient))
	if len(resps) != 3 || resps[2].BodyLen != uint64(len(big)) {
		t.Fatalf("client responses %d (last body %v), want 3 with a 1 MiB last body", len(resps), resps)
	}
}

func TestGateDropsDisabledGroupsInKernel(t *testing.T) {
	// Only http_client enabled: the server end of the same traffic is
	// discarded before any record is reserved.
	r := newRig(t, 1<<2)
	before := r.stats()
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequest(br); err != nil {
			return
		}
		writeAll(t, c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeAll(t, c, "GET /get_weather HTTP/1.1\r\nHost: h\r\n\r\n")
	_, _ = bufio.NewReader(c).ReadString('\n')
	if got := r.waitFor(2, kindSide(EvResponse, SideClient)); len(got) != 1 {
		t.Fatalf("client responses: %d, want 1", len(got))
	}
	r.settle()
	if srv := r.events(func(e *HTTPEvent) bool { return e.Side == SideServer }); len(srv) != 0 {
		t.Errorf("server-side records emitted with server disabled: %d", len(srv))
	}
	after := r.stats()
	if d := after[StatDiscarded+1] - before[StatDiscarded+1]; d < 1 {
		t.Errorf("discarded[server] moved by %d, want >= 1", d)
	}
	if e := after[StatEmitted+2] - before[StatEmitted+2]; e < 1 {
		t.Errorf("emitted[http_client] moved by %d, want >= 1", e)
	}
}

func TestNonHTTPIgnored(t *testing.T) {
	r := newRig(t, allGroups)
	addr := server(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			c.Write(buf[:n])
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range []string{"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "garbage\x00\xff\r\n\r\n", "GETX / HTTP/1.1\r\n\r\n"} {
		writeAll(t, c, p)
		io.ReadFull(c, make([]byte, len(p)))
	}
	r.settle()
	if got := r.events(func(*HTTPEvent) bool { return true }); len(got) != 0 {
		t.Errorf("non-HTTP bytes produced %d records: %+v", len(got), got[0])
	}
	if st := r.stats(); st[StatNotHTTP] == 0 {
		t.Error("not_http counter did not move")
	}
}

func TestHeadAndContinue(t *testing.T) {
	r := newRig(t, allGroups)
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		// HEAD: the response announces a length but carries no body.
		if _, err := readRequest(br); err != nil {
			return
		}
		writeAll(t, c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
		// Expect: 100-continue: an interim response, then the final one.
		line, _ := br.ReadString('\n')
		for h, _ := br.ReadString('\n'); h != "\r\n"; h, _ = br.ReadString('\n') {
		}
		_ = line
		writeAll(t, c, "HTTP/1.1 100 Continue\r\n\r\n")
		io.CopyN(io.Discard, br, 4)
		writeAll(t, c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	writeAll(t, c, "HEAD /reverify_mode HTTP/1.1\r\nHost: h\r\n\r\n")
	for h, _ := br.ReadString('\n'); h != "\r\n"; h, _ = br.ReadString('\n') {
	}
	writeAll(t, c, "POST /seed_session HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
	for h, _ := br.ReadString('\n'); h != "\r\n"; h, _ = br.ReadString('\n') {
	}
	writeAll(t, c, "abcd")
	io.ReadFull(br, make([]byte, len("HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")))
	resps := r.waitFor(2, kindSide(EvResponse, SideClient))
	if len(resps) != 2 {
		t.Fatalf("client responses %d, want 2 (the interim 100 is not a response of its own)", len(resps))
	}
	if resps[0].Status != 200 || resps[0].BodyLen != 0 {
		t.Errorf("HEAD response: status %d body %d; want 200 with no body", resps[0].Status, resps[0].BodyLen)
	}
	if resps[1].Status != 201 || resps[1].BodyLen != 2 {
		t.Errorf("final response after 100-continue: status %d body %d; want 201, 2", resps[1].Status, resps[1].BodyLen)
	}
}

// readAheadServer serves the requests of one connection as Go's net/http
// server reads them: one byte ahead after each request, so the next
// request's first byte arrives alone. It answers each with resp.
func readAheadServer(t *testing.T, resp string) string {
	return server(t, func(c net.Conn) {
		for {
			one := make([]byte, 1)
			if _, err := io.ReadFull(c, one); err != nil {
				return
			}
			br := bufio.NewReader(io.MultiReader(strings.NewReader(string(one)), c))
			if _, err := readRequest(br); err != nil {
				return
			}
			writeAll(t, c, resp)
		}
	})
}

func TestRequestStartSplitAcrossReads(t *testing.T) {
	r := newRig(t, allGroups)
	addr := readAheadServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for _, p := range []string{"/seed_session", "/verify"} {
		writeAll(t, c, "GET "+p+" HTTP/1.1\r\nHost: h\r\n\r\n")
		for h, _ := br.ReadString('\n'); h != "\r\n"; h, _ = br.ReadString('\n') {
		}
	}
	got := r.waitFor(2, kindSide(EvRequest, SideServer))
	if len(got) != 2 || path(&got[0]) != "/seed_session" || path(&got[1]) != "/verify" {
		var paths []string
		for i := range got {
			paths = append(paths, path(&got[i]))
		}
		t.Fatalf("server requests %q; want /seed_session then /verify", paths)
	}
}

func TestUnsampledInboundCopiesNothing(t *testing.T) {
	r := newRig(t, allGroups)
	c := dialAnswering(t, 2, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	br := bufio.NewReader(c)
	for _, flags := range []string{"00", "01"} {
		writeAll(t, c, "GET /get_weather HTTP/1.1\r\nHost: h\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"+flags+"\r\n\r\n")
		io.ReadFull(br, make([]byte, len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")))
	}
	got := r.waitFor(2, kindSide(EvRequest, SideServer))
	if len(got) != 1 || !strings.HasSuffix(string(got[0].Traceparent[:55]), "-01") {
		t.Fatalf("server requests %d (want only the sampled one)", len(got))
	}
	if resp := r.waitFor(2, kindSide(EvResponse, SideServer)); len(resp) != 1 {
		t.Errorf("server responses %d, want 1 (the unsampled exchange copies nothing)", len(resp))
	}
	if st := r.stats(); st[StatUnsampled] == 0 {
		t.Error("unsampled counter did not move")
	}
}
