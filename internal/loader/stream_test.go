//go:build linux

package loader

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
)

// Both ends of a loopback connection read the same TCP stream position for
// the same request (struct http_event stream_seq), which is what pairs their
// records exactly in userspace (internal/spans join.go). Checked on a
// connection made before gymtrace attached (picked up mid-stream: no
// FlagFresh), on a request whose first byte the server reads alone (Go's
// net/http reads one byte ahead: the start is kept from the previous
// syscall), and on a 200 KiB body written in two parts.
func TestStreamSeqSameOnBothEnds(t *testing.T) {
	needRoot(t)
	addr := readAheadServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	exchange := func(parts ...string) {
		t.Helper()
		writeAll(t, c, parts...)
		if _, err := readRequest(br); err != nil { // the response has the same framing
			t.Fatal(err)
		}
	}
	exchange("GET /before-attach HTTP/1.1\r\nHost: h\r\n\r\n")

	r := newRig(t, allGroups)
	body := strings.Repeat("x", 200<<10)
	reqs := [][]string{
		{"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"},
		{fmt.Sprintf("POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", len(body)), body},
		{"GET /c HTTP/1.1\r\nHost: h\r\n\r\n"},
	}
	for _, parts := range reqs {
		exchange(parts...)
	}
	srv := r.waitFor(3, onConn(c, EvRequest, SideServer))
	cli := r.waitFor(3, onConn(c, EvRequest, SideClient))
	if len(srv) != 3 || len(cli) != 3 {
		t.Fatalf("%d server and %d client request records, want 3 and 3", len(srv), len(cli))
	}
	if cli[0].Flags&FlagFresh != 0 || srv[0].Flags&FlagFresh != 0 {
		t.Errorf("a connection made before attach is marked fresh (client %v, server %v)",
			cli[0].Flags&FlagFresh != 0, srv[0].Flags&FlagFresh != 0)
	}
	for i := range 3 {
		if path(&srv[i]) != path(&cli[i]) {
			t.Fatalf("record %d: server %q, client %q", i, path(&srv[i]), path(&cli[i]))
		}
		if srv[i].StreamOk == 0 || cli[i].StreamOk == 0 {
			t.Errorf("%s: stream position read: server %v, client %v; want both", path(&srv[i]), srv[i].StreamOk != 0, cli[i].StreamOk != 0)
			continue
		}
		if srv[i].StreamSeq != cli[i].StreamSeq {
			t.Errorf("%s: server at %d, client at %d in the stream; want the same", path(&srv[i]), srv[i].StreamSeq, cli[i].StreamSeq)
		}
		if i > 0 {
			if d, want := cli[i].StreamSeq-cli[i-1].StreamSeq, len(strings.Join(reqs[i-1], "")); d != uint32(want) {
				t.Errorf("%s starts %d bytes after %s, which is %d bytes long", path(&cli[i]), d, path(&cli[i-1]), want)
			}
		}
	}
}

// The same on a fresh connection through writev (the offset of each iovec
// segment among the syscall's bytes) and with two requests pipelined in one
// write (the second request's offset within the buffer).
func TestStreamSeqVectoredAndPipelined(t *testing.T) {
	r := newRig(t, allGroups)
	resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	c := dialAnswering(t, -1, resp)
	br := bufio.NewReader(c)
	body := strings.Repeat("y", 3000)
	head := fmt.Sprintf("POST /v HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", len(body))
	// A segment before the request start: the start is at an offset of the
	// syscall's bytes that only seg_off gives.
	pre := "GET /u HTTP/1.1\r\nHost: h\r\n\r\n"
	if _, err := (&net.Buffers{[]byte(pre), []byte(head), []byte(body)}).WriteTo(c); err != nil {
		t.Fatal(err)
	}
	pipe := "GET /p1 HTTP/1.1\r\nHost: h\r\n\r\nGET /p2 HTTP/1.1\r\nHost: h\r\n\r\n"
	for range 2 {
		if _, err := readRequest(br); err != nil {
			t.Fatal(err)
		}
	}
	writeAll(t, c, pipe)
	for range 2 {
		if _, err := readRequest(br); err != nil {
			t.Fatal(err)
		}
	}
	paths := []string{"/u", "/v", "/p1", "/p2"}
	lens := []int{len(pre), len(head) + len(body), len(pipe) / 2}
	srv := r.waitFor(4, onConn(c, EvRequest, SideServer))
	cli := r.waitFor(4, onConn(c, EvRequest, SideClient))
	if len(srv) != 4 || len(cli) != 4 {
		t.Fatalf("%d server and %d client request records, want 4 and 4", len(srv), len(cli))
	}
	for i, p := range paths {
		if path(&srv[i]) != p || path(&cli[i]) != p {
			t.Fatalf("record %d: server %q, client %q, want %q", i, path(&srv[i]), path(&cli[i]), p)
		}
		if srv[i].StreamOk == 0 || cli[i].StreamOk == 0 || srv[i].StreamSeq != cli[i].StreamSeq {
			t.Errorf("%s: server at %d (read %v), client at %d (read %v); want the same", p,
				srv[i].StreamSeq, srv[i].StreamOk != 0, cli[i].StreamSeq, cli[i].StreamOk != 0)
		}
		if i > 0 && cli[i].StreamSeq-cli[i-1].StreamSeq != uint32(lens[i-1]) {
			t.Errorf("%s starts %d bytes after %s, which is %d bytes long", p, cli[i].StreamSeq-cli[i-1].StreamSeq, paths[i-1], lens[i-1])
		}
	}
}
