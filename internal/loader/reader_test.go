package loader

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"
)

// The reader waits in Go's netpoller, not in a blocking epoll_wait: a
// record the kernel submits with a forced wakeup (a target's fork) must reach
// it at once even when the poll timer would not fire for an hour. Were the
// wakeups not delivered, the record would wait for the timer and the test
// would time out.
func TestReaderWakesOnForcedWakeup(t *testing.T) {
	tr := loadSelf(t, allGroups)
	if tr.wakeFile == nil {
		t.Fatal("no pollable duplicate of the ring buffer's fd: wakeups cannot reach the reader")
	}
	tr.pollEvery = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	procs := make(chan struct{}, 16)
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if len(raw) > 0 && IsProcEvent(raw[0]) {
				select {
				case procs <- struct{}{}:
				default:
				}
			}
		})
	}()
	// Let the reader's first drain (and the timer's arming) pass.
	time.Sleep(200 * time.Millisecond)
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-procs:
	case <-time.After(20 * time.Second):
		t.Fatal("the fork's process record did not reach the reader: forced ring-buffer wakeups are lost")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Read: %v", err)
	}
}

// Records pending when ctx ends are delivered before Read returns. HTTP
// records are submitted without a wakeup and the poll timer is an hour away,
// so only the final drain can deliver them.
func TestReaderDrainsWhenStopped(t *testing.T) {
	tr := loadSelf(t, allGroups)
	tr.pollEvery = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	var reqs int
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if len(raw) >= HTTPEventHeadSize && !IsProcEvent(raw[0]) && raw[0] == EvRequest {
				reqs++
			}
		})
	}()
	time.Sleep(200 * time.Millisecond) // past the reader's first drain
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequest(br); err == nil {
			writeAll(t, c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeAll(t, c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := io.ReadFull(c, make([]byte, len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))); err != nil {
		t.Fatal(err)
	}
	if tr.Pending() == 0 {
		t.Fatal("no records pending in the ring buffer after an exchange")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Read: %v", err)
	}
	if reqs != 2 { // the client's and the server's record of the request
		t.Fatalf("%d request records delivered when the reader stopped; want 2", reqs)
	}
}

// Close ends a waiting Read at once, not at the reader's next timer.
func TestReaderReturnsOnClose(t *testing.T) {
	tr := loadSelf(t, allGroups)
	tr.pollEvery = time.Hour
	done := make(chan error, 1)
	go func() { done <- tr.Read(context.Background(), func([]byte) {}) }()
	time.Sleep(200 * time.Millisecond) // Read is waiting on its hour-long timer
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Read after Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Read still waiting after Close")
	}
}

// When ctx ends, Read delivers what the ring holds then, not what is written
// while it drains: under load the traced processes refill the ring as fast
// as the reader empties it, and a drain "until empty" did not end (a
// SIGTERM'd gymtrace under load must still exit). Here every record
// delivered after the stop makes one more exchange before the reader looks
// again, so the ring is never empty; a reader that drains until it is
// would take every one of them.
func TestReaderStopsAtWhatWasPending(t *testing.T) {
	tr := loadSelf(t, allGroups)
	tr.pollEvery = time.Hour
	exchange := keepAliveExchange(t)
	// Records pending, the reader's first drain past.
	ctx, cancel := context.WithCancel(context.Background())
	var stopped atomic.Bool
	const most = 2000 // exchanges made while the reader drains: far past what was pending
	made := 0
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if !stopped.Load() || made >= most {
				return
			}
			made++
			if err := exchange(); err != nil {
				t.Error(err)
				made = most
			}
		})
	}()
	for range 4 {
		if err := exchange(); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Pending() == 0 {
		t.Fatal("no records pending in the ring buffer after four exchanges")
	}
	stopped.Store(true)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Read: %v", err)
	}
	if made >= most {
		t.Fatalf("the reader kept delivering what was written after it was stopped (%d exchanges made meanwhile)", made)
	}
	t.Logf("%d exchanges made while the stopped reader drained", made)
}

// A lagging reader (GYMTRACE_TEST_LAGGING_READER, for tests of loss) lets a
// one-page ring overflow, then reads again: the kernel counts the loss, the
// records that fit are delivered, and when the traffic stops the reader
// drains what the ring holds without waiting for more (or for ctx). A reader
// that kept up would lose nothing; one that lagged for good would leave the
// ring full.
func TestLaggingReader(t *testing.T) {
	tr := loadSelfWith(t, allGroups, Options{RingbufBytes: os.Getpagesize()})
	tr.lagging = true
	exchange := keepAliveExchange(t)
	lost := func() uint64 {
		st, err := tr.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[StatRingbufFull]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reqs atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if len(raw) >= HTTPEventHeadSize && !IsProcEvent(raw[0]) && raw[0] == EvRequest {
				reqs.Add(1)
			}
		})
	}()
	// No overflow yet: one exchange fits the ring, and the lagging reader
	// drains it once the ring stops filling (it never overflows here).
	if err := exchange(); err != nil {
		t.Fatal(err)
	}
	waitDrained := func(when string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for tr.Pending() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := tr.Pending(); n > 0 {
			t.Fatalf("%d bytes still pending 20 s %s: the lagging reader waits for traffic", n, when)
		}
	}
	waitDrained("after one exchange")
	if n := lost(); n != 0 {
		t.Fatalf("%d records lost after one exchange into a one-page ring", n)
	}
	// Exchanges until the kernel counts a loss: a page holds a few
	// exchanges' records, and the lagging reader reads none of them until
	// the ring overflows. A reader that kept up would go on far longer.
	const most = 100000
	made := 0
	for ; made < most && lost() == 0; made++ {
		if err := exchange(); err != nil {
			t.Fatal(err)
		}
	}
	if lost() == 0 {
		t.Fatalf("no record lost after %d exchanges into a one-page ring with a lagging reader", made)
	}
	// Each exchange is at least two request records and two response heads.
	if fit := os.Getpagesize()/(4*HTTPEventHeadSize) + 2; made > fit {
		t.Errorf("the first loss came after %d exchanges; a page holds at most %d: the reader did not lag", made, fit)
	}
	// The traffic stops: what the ring holds is delivered, with no more
	// traffic and ctx still running.
	waitDrained("after the traffic stopped")
	if reqs.Load() == 0 {
		t.Fatal("no request record delivered")
	}
	t.Logf("%d exchanges, %d request records delivered, %d records lost", made, reqs.Load(), lost())
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Read: %v", err)
	}
}

// The lagging reader falls behind again only after lagEvery records and
// while the ring has refused under lagShare of what it was offered: the
// share of records lost is the test's condition, not how long a busy
// machine keeps the reader off the CPU.
func TestLagDue(t *testing.T) {
	for _, c := range []struct {
		sinceLoss          int
		refused, delivered uint64
		want               bool
	}{
		{lagEvery, 0, 0, true},            // nothing lost yet: lag
		{lagEvery - 1, 0, 5000, false},    // too soon after an overflow
		{lagEvery, 40, 960, true},         // 4 % refused
		{lagEvery, 50, 950, false},        // 5 %: read on
		{lagEvery, 400, 600, false},       // a long burst: read on
		{10 * lagEvery, 400, 9600, true},  // back under 5 %
		{10 * lagEvery, 400, 7600, false}, // still over
	} {
		if got := lagDue(c.sinceLoss, c.refused, c.delivered); got != c.want {
			t.Errorf("lagDue(%d, refused %d, delivered %d) = %v, want %v", c.sinceLoss, c.refused, c.delivered, got, c.want)
		}
	}
}

// A filling ring buffer keeps its last eighth for request records: with
// the reader lagging, response records stop at seven eighths pending
// (counted shed) while request records go on until the ring is full. A lost
// request record loses its span and its calls' parent; a lost response
// only ends its span early, so under overload the cheaper one goes first.
func TestShedResponsesFirst(t *testing.T) {
	ring := 8 * os.Getpagesize()
	tr := loadSelfWith(t, allGroups, Options{RingbufBytes: ring})
	tr.lagging = true
	exchange := keepAliveExchange(t)
	stat := func(slot uint32) uint64 {
		st, err := tr.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[slot]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reqs, resps atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if len(raw) < HTTPEventHeadSize || IsProcEvent(raw[0]) {
				return
			}
			switch raw[0] {
			case EvRequest:
				reqs.Add(1)
			case EvResponse:
				resps.Add(1)
			}
		})
	}()
	const most = 100000
	made := 0
	// StatRingbufFull counts the shed responses too: a reservation that
	// failed is one more than those.
	failed := func() uint64 {
		st, err := tr.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st[StatRingbufFull] - st[StatResponseShed]
	}
	for ; made < most && failed() == 0; made++ {
		if err := exchange(); err != nil {
			t.Fatal(err)
		}
	}
	if failed() == 0 {
		t.Fatalf("no reservation failed after %d exchanges into a %d-byte ring with a lagging reader", made, ring)
	}
	shed := stat(StatResponseShed)
	if shed == 0 {
		t.Errorf("no response record shed before the ring was full: its last eighth was not kept for requests")
	}
	deadline := time.Now().Add(30 * time.Second)
	for tr.Pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := tr.Pending(); n > 0 {
		t.Fatalf("%d bytes still pending 30 s after the traffic stopped", n)
	}
	// Each whole exchange is two requests and two responses (both ends are
	// this process); the last eighth, up to the first failure, held
	// requests alone: at least as many more requests than responses as fit
	// there, less the two of an exchange cut at the seven-eighths mark.
	fit := (ring / 8) / (HTTPEventSize + 8)
	if fit < 4 {
		t.Fatalf("an eighth of %d bytes holds %d request records of %d bytes: too few to tell", ring, fit, HTTPEventSize)
	}
	extra := reqs.Load() - resps.Load()
	if extra < int64(fit-2) {
		t.Errorf("%d request and %d response records delivered (%d more requests), want at least %d more: the last eighth did not go to requests",
			reqs.Load(), resps.Load(), extra, fit-2)
	}
	t.Logf("%d exchanges into %d bytes: %d request and %d response records delivered, %d responses shed, %d reservations failed",
		made, ring, reqs.Load(), resps.Load(), shed, failed())
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Read: %v", err)
	}
}

// keepAliveExchange starts a server in the test process that answers every
// request on a connection "200 ok", connects to it, and returns one
// exchange on that keep-alive connection (a request written, its answer
// read).
func keepAliveExchange(t *testing.T) func() error {
	t.Helper()
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := readRequest(br); err != nil {
				return
			}
			if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
				return
			}
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	return func() error {
		if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return err
		}
		_, err := io.ReadFull(br, make([]byte, len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")))
		return err
	}
}
