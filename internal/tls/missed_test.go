//go:build linux

package tls

import (
	"bufio"
	"io"
	"net"
	"os"
	"testing"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/tls/testbpf"
)

// TestKernelUnseenRequestStart: a request start the kernel never saw (a
// program run it skipped: on a preemptible kernel bpf_prog_active makes it
// skip tracing programs; or bytes the parser lost) leaves that side's
// request count one behind the peer's for good, so the next records must say
// so (GT_GAP_FRAMING) and no join may go by request index. Plain HTTP/1.1
// over loopback in this process, with this package's test object (the
// product's syscall programs): /a whole; /b with sys_exit_write detached, so
// the client's request start and the server's response start go unseen;
// then /c whole.
//
// The server saw /b come in but not its answer. The answer's bytes are in
// the socket's write_seq by the time /c is read (gt_pos_check), so /b's
// response is given up there and the answer to /c keeps /c's index: without
// the check the server gave it /b's, and /c's span /b's end (issue 37).
func TestKernelUnseenRequestStart(t *testing.T) {
	k, cli, srv := tracedPair(t)
	exchange := exchanger(t, cli, srv)
	exchange("/a")
	k.unseenWrites(t, func() { exchange("/b") })
	exchange("/c")

	type rec struct {
		side, kind uint8
		seq        uint64
		path       string
		gap        uint8
	}
	var got []rec
	for _, e := range k.take(os.Getpid()) {
		r := rec{side: e.ev.Side, kind: e.ev.Kind, seq: e.ev.Seq, gap: e.ev.Gap}
		if e.ev.Kind == testbpf.EvRequest {
			r.path = string(e.ev.Path[:min(int(e.ev.PathLen), len(e.ev.Path))])
		}
		got = append(got, r)
	}
	reqIdx := map[[2]string]uint64{}
	var srvResps []uint64
	gaps := map[[2]string]uint8{}
	for _, r := range got {
		side := map[bool]string{true: "server", false: "client"}[r.side == uint8(loader.SideServer)]
		switch r.kind {
		case testbpf.EvRequest:
			reqIdx[[2]string{side, r.path}] = r.seq
			gaps[[2]string{side, r.path}] = r.gap
		case testbpf.EvResponse:
			if side == "server" {
				srvResps = append(srvResps, r.seq)
			}
		}
	}
	t.Logf("records: %+v", got)
	sc, ok := reqIdx[[2]string{"server", "/c"}]
	if !ok || reqIdx[[2]string{"server", "/a"}] != 0 {
		t.Fatalf("server requests %v: want /a at index 0 and /c", reqIdx)
	}
	if len(srvResps) != 2 || srvResps[0] != 0 || srvResps[1] != sc {
		t.Errorf("server responses at indexes %v: want [0 %d] (/a's, then /c's; /b's was never seen)", srvResps, sc)
	}
	if g, ok := gaps[[2]string{"client", "/c"}]; !ok || g&uint8(loader.GapFraming) == 0 {
		t.Errorf("client /c gap %#x (seen %v): want GT_GAP_FRAMING (its request /b went out unseen)", g, ok)
	}
}

// unseenWrites runs f with sys_exit_write detached: the kernel misses every
// write f makes, as when a preemptible kernel skips the program.
func (k *kernel) unseenWrites(t *testing.T, f func()) {
	t.Helper()
	if err := k.links["sys_exit_write"].Close(); err != nil {
		t.Fatal(err)
	}
	f()
	l, err := link.Tracepoint("syscalls", "sys_exit_write", k.objs.GtExitWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	k.links["sys_exit_write"] = l
}

// TestKernelUnseenBodyBytes: bytes of a Content-Length body that moved
// unseen (a skipped program; sendfile) are skipped exactly by their stream
// position: the response still ends where it ends, with its whole size, and
// the next exchange keeps its index. In "middle" the unseen write is inside
// the body; in "end" it is the whole body after a head written alone (as
// uvicorn writes an answer), so the body ends unseen: the response ends at
// the next syscall on the connection (the read of /b), flagged
// GT_F_BODY_UNKNOWN. Before, "end"'s response was given up, and on a kernel
// that skips programs each such span ended at the next exchange's answer.
func TestKernelUnseenBodyBytes(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		before, unseen, after string
		flag                  uint16 // on /a's response
	}{
		{"middle", "abc", "def", "ghi", 0},
		{"end", "", "abcdefghi", "", loader.FlagBodyUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, cli, srv := tracedPair(t)
			sr, cr := bufio.NewReader(srv), bufio.NewReader(cli)
			write := func(c net.Conn, s string) {
				t.Helper()
				if _, err := io.WriteString(c, s); err != nil {
					t.Fatal(err)
				}
			}
			read := func(r *bufio.Reader, n int) {
				t.Helper()
				if _, err := io.ReadFull(r, make([]byte, n)); err != nil {
					t.Fatal(err)
				}
			}
			for _, path := range []string{"/a", "/b"} {
				req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n"
				write(cli, req)
				read(sr, len(req))
				head := "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
				if path == "/a" {
					write(srv, head+tc.before)
					k.unseenWrites(t, func() { write(srv, tc.unseen) })
					if tc.after != "" {
						write(srv, tc.after)
					}
				} else {
					write(srv, head+"abcdefghi")
				}
				read(cr, len(head)+9)
			}

			var srvResps []rawEvent
			for _, e := range k.take(os.Getpid()) {
				if e.ev.Side == uint8(loader.SideServer) && e.ev.Kind == testbpf.EvResponse {
					srvResps = append(srvResps, e)
				}
			}
			if len(srvResps) != 2 {
				t.Fatalf("%d server responses, want 2", len(srvResps))
			}
			for i, e := range srvResps {
				if e.ev.Seq != uint64(i) || e.ev.BodyLen != 9 {
					t.Errorf("server response %d: index %d, body %d bytes; want index %d, 9 bytes", i, e.ev.Seq, e.ev.BodyLen, i)
				}
			}
			if got := srvResps[0].ev.Flags & loader.FlagBodyUnknown; got != tc.flag {
				t.Errorf("/a's response flags %#x: GT_F_BODY_UNKNOWN %#x, want %#x", srvResps[0].ev.Flags, got, tc.flag)
			}
			if n := k.stat(t, testbpf.StatStreamGapBody); n != 1 {
				t.Errorf("stream_body_gap = %d, want 1", n)
			}
		})
	}
}

// TestKernelUnseenClose: a connection's close that the kernel never saw (a
// skipped gt_enter_close, or a close gymtrace does not hook: dup2 over the
// fd, as here) must not hand the old connection's entry to the next socket
// given the same fd: the new connection gets its own id, its own tuple and
// request index 0, and the old one is counted stale.
func TestKernelUnseenClose(t *testing.T) {
	k := loadKernel(t)
	k.gate(t, groups.Server.Mask()|groups.HTTPClient.Mask(), 1)
	k.target(t, os.Getpid())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().(*net.TCPAddr)
	dial := func() int {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		sa := &unix.SockaddrInet4{Port: addr.Port}
		copy(sa.Addr[:], addr.IP.To4())
		if err := unix.Connect(fd, sa); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	exchange := func(fd int, path string) {
		t.Helper()
		srv, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n"
		if _, err := unix.Write(fd, []byte(req)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(srv, make([]byte, len(req))); err != nil {
			t.Fatal(err)
		}
		resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if _, err := io.WriteString(srv, resp); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(resp))
		for got := 0; got < len(resp); {
			n, err := unix.Read(fd, buf[got:])
			if err != nil || n == 0 {
				t.Fatalf("reading the response: %d, %v", n, err)
			}
			got += n
		}
	}
	a := dial()
	defer unix.Close(a)
	exchange(a, "/a")
	b := dial()
	// fd a now names b's socket; a's close is never a close(2).
	if err := unix.Dup2(b, a); err != nil {
		t.Fatal(err)
	}
	unix.Close(b)
	exchange(a, "/b")

	type req struct {
		conn  uint64
		seq   uint64
		lport uint16
	}
	client := map[string]req{}
	for _, e := range k.take(os.Getpid()) {
		if e.ev.Kind == testbpf.EvRequest && e.ev.Side == uint8(loader.SideClient) {
			path := string(e.ev.Path[:min(int(e.ev.PathLen), len(e.ev.Path))])
			client[path] = req{e.ev.ConnId, e.ev.Seq, e.ev.Tuple.Lport}
		}
	}
	ra, rb := client["/a"], client["/b"]
	if ra.conn == 0 || rb.conn == 0 {
		t.Fatalf("client requests %+v: want /a and /b", client)
	}
	if rb.conn == ra.conn || rb.seq != 0 || rb.lport == ra.lport {
		t.Errorf("/b on the new socket: conn %d index %d port %d; /a was conn %d port %d: want a new conn, index 0, its own port",
			rb.conn, rb.seq, rb.lport, ra.conn, ra.lport)
	}
	if n := k.stat(t, testbpf.StatStaleConn); n != 1 {
		t.Errorf("stale_conn = %d, want 1", n)
	}
}

// exchanger makes exchanges on a client and server pair: GET path, then
// 200 with "ok".
func exchanger(t *testing.T, cli, srv net.Conn) func(path string) {
	sr, cr := bufio.NewReader(srv), bufio.NewReader(cli)
	return func(path string) {
		t.Helper()
		req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n"
		if _, err := io.WriteString(cli, req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(sr, make([]byte, len(req))); err != nil {
			t.Fatal(err)
		}
		resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if _, err := io.WriteString(srv, resp); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(cr, make([]byte, len(resp))); err != nil {
			t.Fatal(err)
		}
	}
}

// tracedPair loads the test object with the server and client groups on,
// targets this process, and connects a client to a server over loopback.
func tracedPair(t *testing.T) (k *kernel, cli, srv net.Conn) {
	t.Helper()
	k = loadKernel(t)
	k.gate(t, groups.Server.Mask()|groups.HTTPClient.Mask(), 1)
	k.target(t, os.Getpid())
	cli, srv = loopbackPair(t)
	return k, cli, srv
}
