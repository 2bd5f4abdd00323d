package loader

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// A request whose record finds the ring buffer full when it ends is written
// late, at its response's first bytes, once the reader has made room
// (gt_emit_late_request): the span is kept, with its own times and data,
// and its response pairs with it by index. Both ends are this process, so
// both the client's and the server's request records are late. Without the
// late write neither arrives (each end's response, its request unseen, is
// skipped too) and the test fails.
func TestLateRequestRecord(t *testing.T) {
	ring := 8 * os.Getpagesize()
	tr := loadSelfWith(t, allGroups, Options{RingbufBytes: ring})
	stats := func() []uint64 {
		st, err := tr.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Reservations that failed (responses shed are counted apart).
	failed := func() uint64 { st := stats(); return st[StatRingbufFull] - st[StatResponseShed] }

	// No reader yet: fill the ring until a reservation fails.
	exchange := keepAliveExchange(t)
	for made := 0; failed() == 0; made++ {
		if made == 100000 {
			t.Fatalf("no reservation failed after %d exchanges into a %d-byte ring nobody reads", made, ring)
		}
		if err := exchange(); err != nil {
			t.Fatal(err)
		}
	}

	// A request on a new connection, read by its server: both ends'
	// records find no room.
	got := make(chan net.Conn, 1)
	addr := server(t, func(c net.Conn) {
		got <- c
		<-t.Context().Done()
	})
	cl, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sv := <-got
	before := failed()
	writeAll(t, cl, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	sbr := bufio.NewReader(sv)
	if _, err := readRequest(sbr); err != nil {
		t.Fatal(err)
	}
	if n := failed() - before; n < 2 {
		t.Fatalf("%d reservations failed for the request's two records, want 2: the ring was not full", n)
	}

	// Make room: read everything pending.
	var mu sync.Mutex
	var evs []HTTPEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tr.Read(ctx, func(raw []byte) {
			if len(raw) < HTTPEventHeadSize || IsProcEvent(raw[0]) || raw[0] == EvGenAI {
				return
			}
			var ev HTTPEvent
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), HTTPEventSize), raw)
			mu.Lock()
			evs = append(evs, ev)
			mu.Unlock()
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Read: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for tr.Pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := tr.Pending(); n > 0 {
		t.Fatalf("%d bytes still pending 30 s after the traffic stopped", n)
	}

	// The answer: each end's request record goes first, late.
	writeAll(t, sv, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
	if _, err := io.ReadFull(bufio.NewReader(cl), make([]byte, len("HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"))); err != nil {
		t.Fatal(err)
	}
	find := func() (reqs, resps []HTTPEvent) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			if e.Kind == EvRequest && path(&e) == "/late" {
				reqs = append(reqs, e)
			}
		}
		for _, e := range evs {
			for _, r := range reqs {
				if e.Kind == EvResponse && e.ConnId == r.ConnId && e.Seq == r.Seq {
					resps = append(resps, e)
				}
			}
		}
		return
	}
	var reqs, resps []HTTPEvent
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if reqs, resps = find(); len(reqs) == 2 && len(resps) == 2 {
			break
		}
	}
	if len(reqs) != 2 || len(resps) != 2 {
		t.Fatalf("%d request records of POST /late and %d responses paired with them, want 2 and 2 (late request records: %d)",
			len(reqs), len(resps), stats()[StatRequestLate])
	}
	sides := map[uint8]bool{}
	for _, r := range reqs {
		sides[r.Side] = true
		if r.Gap&GapLate == 0 {
			t.Errorf("side %d: the request record does not say it is late (gap %#x)", r.Side, r.Gap)
		}
		if r.BodyLen != 2 || r.EndNs < r.StartNs || r.StartNs == 0 {
			t.Errorf("side %d: the late record lost the request's own data: body %d, start %d, end %d", r.Side, r.BodyLen, r.StartNs, r.EndNs)
		}
	}
	if !sides[SideClient] || !sides[SideServer] {
		t.Errorf("late request records on sides %v, want the client's and the server's", sides)
	}
	for _, r := range resps {
		if r.Status != 201 {
			t.Errorf("side %d: the response paired with the late request has status %d, want 201", r.Side, r.Status)
		}
	}
	if n := stats()[StatRequestLate]; n < 2 {
		t.Errorf("the kernel counted %d late request records, want at least 2", n)
	}
}
