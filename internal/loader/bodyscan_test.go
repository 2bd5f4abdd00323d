//go:build linux

package loader

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The kernel's body scans (bpf/http.h): rollout ids in /run request bodies,
// driven through the real programs with sockets in the test process.

const (
	groupServer  = 1 << 1
	groupRollout = 1 << 3
)

// newScanRig is newRig with gate flags and a route table: the body scans
// run only for routes whose groups ask for them.
func newScanRig(t *testing.T, mask uint64, flags uint32, routes map[RouteKey]uint64) *rig {
	r := newRig(t, mask)
	if err := r.tr.SetRoutes(routes); err != nil {
		t.Fatal(err)
	}
	r.setGate(mask, flags)
	return r
}

func (r *rig) setGate(mask uint64, flags uint32) {
	var sp [8]uint64
	for i := range sp {
		sp[i] = allGroups
	}
	if err := r.tr.SetGate(mask, sp, allGroups, flags); err != nil {
		r.t.Fatal(err)
	}
}

// onConn selects the records of one connection, by the client's port, with
// kind and side.
func onConn(c net.Conn, kind, side uint8) func(*HTTPEvent) bool {
	port := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	return func(e *HTTPEvent) bool {
		p := e.Tuple.Rport
		if side == SideClient {
			p = e.Tuple.Lport
		}
		return e.Kind == kind && e.Side == side && p == port
	}
}

// runBody sends one POST /run with body and returns the server's request
// record. The server waits before it reads, so the whole request is queued
// and its one read (a 1 MiB buffer) sees the body in a single buffer: the
// scan's windows are then those of the whole body.
func runBody(t *testing.T, r *rig, body string) HTTPEvent {
	t.Helper()
	addr := server(t, func(c net.Conn) {
		time.Sleep(50 * time.Millisecond)
		if _, err := readRequest(bufio.NewReaderSize(c, 1<<20)); err != nil {
			return
		}
		writeAll(t, c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeAll(t, c, fmt.Sprintf("POST /run HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	io.ReadFull(c, make([]byte, len("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")))
	got := r.waitFor(1, onConn(c, EvRequest, SideServer))
	if len(got) != 1 {
		t.Fatalf("server requests: %d, want 1", len(got))
	}
	if got[0].BodyLen != uint64(len(body)) {
		t.Fatalf("body length %d, want %d", got[0].BodyLen, len(body))
	}
	return got[0]
}

// filler is a JSON string member of n bytes, ", " included.
func filler(key string, n int) string {
	pre := fmt.Sprintf(`"%s": "`, key)
	return pre + strings.Repeat("x", n-len(pre)-3) + `", `
}

func TestRolloutScanWindows(t *testing.T) {
	routes := map[RouteKey]uint64{NewRouteKey(RoleUnknown, MethodPOST, "/run"): groupRollout}
	cases := []struct {
		name string
		body string
		want [3]int32 // task, rollout, attempt
		id   string
	}{
		{"small body", `{"_ng_task_index": 3, "_ng_rollout_index": 5, "responses_create_params": {}}`, [3]int32{3, 5, -1}, ""},
		// 40 KiB: windows [0, 8128) and the last 8,128 bytes are read; a
		// key at 20 KiB is in neither.
		{"head and tail of a long body",
			`{"_ng_task_index": 7, ` + filler("a", 20000) + `"_ng_attempt_index": 2, ` + filler("b", 20000) +
				`"_ng_rollout_index": 11, "_ng_rollout_id": "row-11"}`,
			[3]int32{7, 11, -1}, "row-11"},
		// 16,000 bytes: not longer than the four windows end to end, so
		// they cover it whole.
		{"four windows cover 16 KB", `{` + filler("a", 9000) + `"_ng_task_index": 4, ` + filler("b", 6900) + `"_ng_rollout_index": 1}`,
			[3]int32{4, 1, -1}, ""},
	}
	r := newScanRig(t, allGroups, CfgRolloutIDs, routes)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := runBody(t, r, c.body)
			if e.Flags&FlagRollout == 0 {
				t.Fatalf("no rollout ids found (flags %#x)", e.Flags)
			}
			got := [3]int32{e.Rollout.Task, e.Rollout.Rollout, e.Rollout.Attempt}
			if got != c.want || string(e.Rollout.Id[:e.Rollout.IdLen]) != c.id {
				t.Errorf("rollout %v id %q, want %v %q", got, e.Rollout.Id[:e.Rollout.IdLen], c.want, c.id)
			}
		})
	}
	t.Run("flag off", func(t *testing.T) {
		r.setGate(allGroups, 0)
		if e := runBody(t, r, `{"_ng_task_index": 3, "_ng_rollout_index": 5}`); e.Flags&FlagRollout != 0 {
			t.Errorf("rollout ids read without CfgRolloutIDs: %+v", e.Rollout)
		}
	})
}
