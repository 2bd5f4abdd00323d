//go:build linux

package loader

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// A model server's CLIENT calls upstream get the GenAI walk (issue 40): the
// test process is a model-role target; its client writes the request and
// reads the answer in reads of a few bytes, so chunk-size lines, keys and
// numbers are cut by the ends of reads.

// genaiClientExchange: the client POSTs reqBody to path and reads the answer
// (parts, written whole by the server) in reads of at most step bytes after
// its header block. Returns the client side's GenAI record, if one came.
func genaiClientExchange(t *testing.T, r *rig, path, reqBody string, step int, parts ...string) (GenAIEvent, bool) {
	t.Helper()
	resp := strings.Join(parts, "")
	addr := server(t, func(c net.Conn) {
		if _, err := readRequest(bufio.NewReaderSize(c, 4096)); err != nil {
			return
		}
		writeAll(t, c, parts...)
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	writeAll(t, c, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, len(reqBody), reqBody))
	head := strings.Index(resp, "\r\n\r\n") + 4
	buf := make([]byte, len(resp))
	for got := 0; got < len(resp); {
		n := step
		if got < head {
			n = head - got
		}
		n = min(n, len(resp)-got)
		m, err := c.Read(buf[got : got+n])
		if err != nil {
			t.Fatal(err)
		}
		got += m
	}
	s := r.waitFor(1, onConn(c, EvResponse, SideClient))
	if len(s) != 1 {
		t.Fatalf("client responses: %d, want 1", len(s))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.ga {
		if g.ConnId == s[0].ConnId && g.Seq == s[0].Seq {
			return g, true
		}
	}
	return GenAIEvent{}, false
}

func TestGenAIClientWalk(t *testing.T) {
	routes := map[RouteKey]uint64{}
	for _, p := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages"} {
		routes[NewRouteKey(RoleModel, MethodPOST, p)] = groupModelCall
	}
	r := newScanRig(t, allGroups, CfgGenAI, routes)
	if err := r.tr.AddTarget(os.Getpid(), RoleModel); err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role": "user", "content": "` + strings.Repeat("lorem \"model\": \"no\" ", 4000) + `"}]`
	big := strings.Repeat("y", 70000)
	chatSSE := []string{sseHead,
		chunk(sseEvent("", `{"object": "chat.completion.chunk", "model": "up-m", "choices": [{"delta": {"content": "`+big+`"}}], "usage": null}`)),
		chunk(sseEvent("", `{"object": "chat.completion.chunk", "model": "up-m", "choices": [], "usage": {"prompt_tokens": 31337, "completion_tokens": 42}}`)),
		chunk(sseEvent("", `[DONE]`)), "0\r\n\r\n"}
	msgJSON := `{"id": "m", "type": "message", "model": "claude-up", "content": [{"type": "text", "text": "` + big + `"}], ` +
		`"usage": {"input_tokens": 250, "output_tokens": 150}}`
	cases := []struct {
		name, path, req string
		step            int
		parts           []string
		want            genaiWant
	}{
		{"chat SSE over 64 KiB, chunked, 5-byte reads", "/v1/chat/completions", `{"messages": ` + msgs + `, "model": "up-m", "stream": true}`,
			5, chatSSE, genaiWant{"up-m", "up-m", 31337, 42}},
		{"messages JSON over 64 KiB under /ng-rollout/<id>, 3-byte reads", "/ng-rollout/7-0/v1/messages", `{"model": "claude-up"}`,
			3, []string{jsonResp(msgJSON)}, genaiWant{"claude-up", "claude-up", 250, 150}},
		{"responses JSON chunked, 1-byte reads", "/v1/responses", `{"input": "hi", "model": "gpt-up"}`, 1,
			[]string{"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", chunk(`{"model": "gpt-up", "usage": {"input_tokens": 1`),
				chunk(`2345, "output_tokens": 6}}`), "0\r\n\r\n"}, genaiWant{"gpt-up", "gpt-up", 12345, 6}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, ok := genaiClientExchange(t, r, c.path, c.req, c.step, c.parts...)
			if !ok {
				t.Fatal("no GenAI record for the client side")
			}
			got := genaiWant{string(g.ReqModel[:g.ReqModelLen]), string(g.RespModel[:g.RespModelLen]), int(g.InputTokens), int(g.OutputTokens)}
			if g.Have != c.want.have() || got != c.want {
				t.Errorf("have %#x %+v, want %#x %+v", g.Have, got, c.want.have(), c.want)
			}
		})
	}
	// Not a model route: no walk.
	if _, ok := genaiClientExchange(t, r, "/v1/models", `{"model": "x"}`, 64,
		jsonResp(`{"model": "x", "usage": {"input_tokens": 1, "output_tokens": 2}}`)); ok {
		t.Error("a GenAI record for a CLIENT call on another route")
	}
	// http_client off: no walk.
	r.setGate(allGroups&^(1<<2), CfgGenAI|CfgNoGate)
	if _, ok := genaiClientExchange(t, r, "/v1/responses", `{"model": "x"}`, 64,
		jsonResp(`{"model": "x", "usage": {"input_tokens": 1, "output_tokens": 2}}`)); ok {
		t.Error("a GenAI record for a CLIENT call with http_client off")
	}
}
