//go:build linux

package tls

import (
	"bufio"
	"io"
	"net"
	"os"
	"testing"

	"github.com/cilium/ebpf/link"

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
// What is not fixed yet: the server, which saw /b come in but not its
// answer, gives the answer to /c /b's index (a pipelining client looks the
// same to the response count; telling them apart needs the response
// direction's stream position). Logged here, asserted once fixed (issue 37).
func TestKernelUnseenRequestStart(t *testing.T) {
	k := loadKernel(t)
	k.gate(t, groups.Server.Mask()|groups.HTTPClient.Mask(), 1)
	k.target(t, os.Getpid())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sr, cr := bufio.NewReader(srv), bufio.NewReader(cli)
	exchange := func(path string) {
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
	exchange("/a")
	w := k.links["sys_exit_write"]
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	exchange("/b")
	l, err := link.Tracepoint("syscalls", "sys_exit_write", k.objs.GtExitWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	k.links["sys_exit_write"] = l
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
		t.Logf("known, open: server responses at indexes %v, the answer to /c should carry /c's index %d", srvResps, sc)
	}
	if g, ok := gaps[[2]string{"client", "/c"}]; !ok || g&uint8(loader.GapFraming) == 0 {
		t.Errorf("client /c gap %#x (seen %v): want GT_GAP_FRAMING (its request /b went out unseen)", g, ok)
	}
}
