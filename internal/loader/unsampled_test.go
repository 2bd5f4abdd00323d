//go:build linux

package loader

import (
	"bufio"
	"io"
	"net"
	"testing"
)

// An inbound request whose traceparent says "not sampled" is not copied out
// (its spans would be dropped), unless CfgKeepUnsampled asks for it: Gym's
// metrics count every request.
func TestUnsampledInboundKept(t *testing.T) {
	const resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	for _, keep := range []bool{false, true} {
		var flags uint32
		if keep {
			flags = CfgKeepUnsampled
		}
		r := newScanRig(t, allGroups, flags, nil)
		addr := server(t, func(c net.Conn) {
			if _, err := readRequest(bufio.NewReader(c)); err != nil {
				return
			}
			writeAll(t, c, resp)
		})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		before := r.stats()[StatUnsampled]
		writeAll(t, c, "POST /verify HTTP/1.1\r\nHost: res\r\ntraceparent: "+tp+"\r\nContent-Length: 2\r\n\r\n{}")
		io.ReadFull(c, make([]byte, len(resp)))
		// The client's records always go out, and its response's after the
		// server's request: once it is here, the server's would be too.
		r.waitFor(1, onConn(c, EvResponse, SideClient))
		want := 0
		if keep {
			want = 1
		}
		got := r.waitFor(want, onConn(c, EvRequest, SideServer))
		c.Close()
		skipped := r.stats()[StatUnsampled] - before
		switch {
		case keep && (len(got) != 1 || skipped != 0):
			t.Errorf("CfgKeepUnsampled: %d server requests, %d counted unsampled; want 1, 0", len(got), skipped)
		case !keep && (len(got) != 0 || skipped != 1):
			t.Errorf("default: %d server requests, %d counted unsampled; want 0, 1", len(got), skipped)
		}
	}
}
