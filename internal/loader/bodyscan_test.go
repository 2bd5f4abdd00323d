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

// The kernel's body scans (bpf/http.h, bpf/http_reward.h): rollout ids in
// /run request bodies, driven through the real programs with sockets in the
// test process.

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

// onConn selects the records of one connection, by both its ports, with
// kind and side. (The client's port alone is not enough: the kernel may give
// a later connection, to another test server, the same ephemeral port, and
// the rig keeps every record of the test.)
func onConn(c net.Conn, kind, side uint8) func(*HTTPEvent) bool {
	cli := uint16(c.LocalAddr().(*net.TCPAddr).Port)
	srv := uint16(c.RemoteAddr().(*net.TCPAddr).Port)
	return func(e *HTTPEvent) bool {
		l, rp := e.Tuple.Lport, e.Tuple.Rport
		if side == SideServer {
			l, rp = rp, l
		}
		return e.Kind == kind && e.Side == side && l == cli && rp == srv
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

const groupVerify = 1 << 6

// verifyExchange: a client POSTs to path, the server answers with the wire
// bytes of parts, one write each (sockets with room for the whole answer,
// so each part is one syscall buffer). Returns the server's and the
// client's response records.
func verifyExchange(t *testing.T, r *rig, path string, parts ...string) (srv, cli HTTPEvent) {
	t.Helper()
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	addr := server(t, func(c net.Conn) {
		c.(*net.TCPConn).SetWriteBuffer(1 << 20)
		if _, err := readRequest(bufio.NewReader(c)); err != nil {
			return
		}
		writeAll(t, c, parts...)
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(1 << 20)
	writeAll(t, c, "POST "+path+" HTTP/1.1\r\nHost: resources\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	if _, err := io.ReadFull(c, make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	s := r.waitFor(1, onConn(c, EvResponse, SideServer))
	cl := r.waitFor(1, onConn(c, EvResponse, SideClient))
	if len(s) != 1 || len(cl) != 1 {
		t.Fatalf("responses: server %d, client %d; want 1 and 1", len(s), len(cl))
	}
	return s[0], cl[0]
}

// jsonResp is a 200 response carrying body, headers and body in one write.
func jsonResp(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s", len(body), body)
}

func rewardText(e *HTTPEvent) (string, bool) {
	if e.Flags&FlagReward == 0 {
		return "", false
	}
	n := 0
	for n < len(e.Reward) && e.Reward[n] != 0 {
		n++
	}
	return string(e.Reward[:n]), true
}

func TestVerifyRewardScan(t *testing.T) {
	routes := map[RouteKey]uint64{NewRouteKey(RoleUnknown, MethodPOST, "/verify"): groupVerify}
	r := newScanRig(t, allGroups, CfgReward, routes)

	// The shape of a Gym verify response: the echoed request (with a
	// "reward" of its own), the model's response, then the reward.
	echoed := `{"responses_create_params": {"input": [{"role": "user", "content": "say \"reward\": 3"}], ` +
		`"metadata": {"reward": 5, "list": [1, {"reward": 6}]}}, `
	big := echoed + `"response": {"output": [{"type": "message", "text": "` + strings.Repeat("lorem ipsum ", 6000) + `"}]}, `
	head := func(b string) string { return fmt.Sprintf("HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n", len(b)) }
	cut := `{"response": {"id": "r1"}, "reward": 0.75}`
	chunkBody := `{"response": {}, "reward": 1}`
	type rewardCase struct {
		name  string
		path  string
		parts []string // the response's wire bytes, one write each
		want  string   // the reward's text, "" for none
	}
	cases := []rewardCase{
		{"over 64 KiB, reward last", "/verify", []string{jsonResp(big + `"reward": 0.75}`)}, "0.75"},
		{"decoys in the window", "/verify", []string{jsonResp(echoed + `"response": {}, "reward": -1.5e-3}`)}, "-1.5e-3"},
		{"exponent", "/verify", []string{jsonResp(`{"reward": 2E+2}`)}, "2E+2"},
		{"integer", "/verify", []string{jsonResp(`{"a": [1, 2], "reward": 1}`)}, "1"},
		{"negative, compact", "/verify", []string{jsonResp(`{"a":{"b":"}"},"reward":-0.25}`)}, "-0.25"},
		{"pretty-printed", "/verify", []string{jsonResp("{\n  \"a\": 1,\n  \"reward\" : 0.5\n}\n")}, "0.5"},
		{"small fields after it", "/verify",
			[]string{jsonResp(big + `"reward": 0.5, "extracted_answer": "42", "judge": {"score": 1, "reward": 9}, "ok": true}`)}, "0.5"},
		{"rollout prefix", "/ng-rollout/r-7/verify", []string{jsonResp(`{"response": {}, "reward": 0}`)}, "0"},
		{"head and body in separate writes", "/verify", []string{head(cut), cut}, "0.75"},
		{"24-byte number", "/verify", []string{jsonResp(`{"reward": -1.2345678901234567e-300}`)}, "-1.2345678901234567e-300"},

		{"decoy nested right before the end", "/verify", []string{jsonResp(big + `"x": {"reward": 5}}`)}, ""},
		{"escaped in a string", "/verify", []string{jsonResp(`{"text": "\"reward\": 3", "y": 1}`)}, ""},
		{"escaped, after a comma", "/verify", []string{jsonResp(`{"text": "a, \"reward\": 3}"}`)}, ""},
		{"number cut by the buffer's edge", "/verify", []string{head(cut), cut[:len(cut)-3], cut[len(cut)-3:]}, ""},
		{"key cut by the buffer's edge", "/verify", []string{head(cut), cut[:len(cut)-12], cut[len(cut)-12:]}, ""},
		{"chunked", "/verify", []string{fmt.Sprintf("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(chunkBody), chunkBody)}, ""},
		{"two top-level keys", "/verify", []string{jsonResp(`{"reward": 1, "reward": 2}`)}, ""},
		{"leading zero", "/verify", []string{jsonResp(`{"reward": 01}`)}, ""},
		{"no fraction digits", "/verify", []string{jsonResp(`{"reward": 1.}`)}, ""},
		{"longer than 24 bytes", "/verify", []string{jsonResp(`{"reward": 0.1234567890123456789012345}`)}, ""},
		{"a string", "/verify", []string{jsonResp(`{"reward": "0.5"}`)}, ""},
		{"not the body's end", "/verify", []string{jsonResp(`{"reward": 1} {"x": 2}`)}, ""},
		// The key must be in the last 8,128 bytes of the buffer.
		{"before the window", "/verify", []string{jsonResp(`{"reward": 1, "pad": "` + strings.Repeat("x", 9000) + `"}`)}, ""},
	}
	// The walk takes eight bytes at a time where it can: every alignment of
	// whitespace before the key, and of escapes and brackets in a string
	// after a first (nested) candidate.
	for shift := 0; shift < 8; shift++ {
		a := `{"pad": "` + strings.Repeat("y", 50+shift) + "\",\n        \"reward\": 0.5\n}\n"
		b := `{"x": {"reward": 9}, "s": "` + strings.Repeat("z", 40+shift) + `\"}{,\\` + strings.Repeat("z", 20) + `", "reward": 0.5}`
		cases = append(cases,
			rewardCase{fmt.Sprintf("aligned %d, whitespace", shift), "/verify", []string{jsonResp(a)}, "0.5"},
			rewardCase{fmt.Sprintf("aligned %d, escapes", shift), "/verify", []string{jsonResp(b)}, "0.5"})
	}
	found, missed := 0, 0
	before := r.stats()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, cli := verifyExchange(t, r, c.path, c.parts...)
			got, ok := rewardText(&srv)
			if c.want == "" {
				missed++
				if ok {
					t.Errorf("reward %q taken, want none", got)
				}
			} else {
				found++
				if !ok || got != c.want {
					t.Errorf("reward %q (found %v), want %q", got, ok, c.want)
				}
			}
			if srv.Status != 200 {
				t.Errorf("status %d", srv.Status)
			}
			if cli.Flags&FlagReward != 0 {
				t.Errorf("the client's response record carries a reward: only the server side is scanned")
			}
		})
	}
	after := r.stats()
	if d := after[StatRewardFound] - before[StatRewardFound]; d != uint64(found) {
		t.Errorf("reward_found moved by %d, want %d", d, found)
	}
	if d := after[StatRewardMissed] - before[StatRewardMissed]; d != uint64(missed) {
		t.Errorf("reward_missed moved by %d, want %d", d, missed)
	}

	// Not scanned, not counted: an error answer, the flag off, the verify
	// group off, another route.
	body := jsonResp(`{"reward": 1}`)
	notScanned := []struct {
		name  string
		mask  uint64
		flags uint32
		path  string
		parts []string
	}{
		{"error status", allGroups, CfgReward, "/verify", []string{strings.Replace(body, "200 OK", "500 Internal Server Error", 1)}},
		{"flag off", allGroups, 0, "/verify", []string{body}},
		{"verify group off", allGroups &^ groupVerify, CfgReward, "/verify", []string{body}},
		{"another route", allGroups, CfgReward, "/seed_session", []string{body}},
	}
	for _, c := range notScanned {
		t.Run(c.name, func(t *testing.T) {
			r.setGate(c.mask, c.flags)
			before := r.stats()
			srv, _ := verifyExchange(t, r, c.path, c.parts...)
			if got, ok := rewardText(&srv); ok {
				t.Errorf("reward %q read", got)
			}
			after := r.stats()
			if after[StatRewardFound] != before[StatRewardFound] || after[StatRewardMissed] != before[StatRewardMissed] {
				t.Errorf("reward counters moved (found %d, missed %d)", after[StatRewardFound]-before[StatRewardFound],
					after[StatRewardMissed]-before[StatRewardMissed])
			}
		})
	}
}
