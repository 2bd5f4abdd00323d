//go:build linux

package loader

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
)

// The kernel's GenAI walk (bpf/http_genai.h): model names and token counts
// of model exchanges, driven through the real programs with sockets in the
// test process (the server side is walked).

const groupModelCall = 1 << 5

type genaiWant struct {
	reqModel, respModel string // "" for none
	in, out             int    // -1 for none
}

func (w genaiWant) have() uint8 {
	var h uint8
	if w.reqModel != "" {
		h |= GenAIReqModel
	}
	if w.respModel != "" {
		h |= GenAIRespModel
	}
	if w.in >= 0 {
		h |= GenAIInput
	}
	if w.out >= 0 {
		h |= GenAIOutput
	}
	return h
}

// genaiExchange: a client POSTs reqBody to path in writes of the given
// sizes (the rest in one last write); the server reads it through a 4 KiB
// buffer (reads of at most 4 KiB) and answers with parts, one write each.
// Returns the server side's GenAI record, if one came.
func genaiExchange(t *testing.T, r *rig, path, reqBody string, reqSplits []int, parts ...string) (GenAIEvent, bool) {
	t.Helper()
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	answered := make(chan struct{}) // the server's writes returned: its records are in the ring
	addr := server(t, func(c net.Conn) {
		defer close(answered)
		c.(*net.TCPConn).SetWriteBuffer(1 << 20)
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
	c.(*net.TCPConn).SetReadBuffer(1 << 20)
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: model\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, len(reqBody), reqBody)
	var w []string
	at := 0
	for _, n := range reqSplits {
		w = append(w, req[at:at+n])
		at += n
	}
	w = append(w, req[at:])
	writeAll(t, c, w...)
	if _, err := io.ReadFull(c, make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	<-answered
	r.settle()
	s := r.events(onConn(c, EvResponse, SideServer))
	if len(s) != 1 {
		t.Fatalf("server responses: %d, want 1 (%s)", len(s), r.connRecords(c))
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

// readResponse consumes one Content-Length response.
func readResponse(br *bufio.Reader) (string, error) { return readRequest(br) }

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

const sseHead = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

func sseEvent(event, data string) string {
	if event != "" {
		return "event: " + event + "\ndata: " + data + "\n\n"
	}
	return "data: " + data + "\n\n"
}

func TestGenAIWalk(t *testing.T) {
	routes := map[RouteKey]uint64{}
	for _, p := range []string{"/v1/chat/completions", "/v1/responses", "/v1/messages"} {
		routes[NewRouteKey(RoleUnknown, MethodPOST, p)] = groupModelCall
	}
	r := newScanRig(t, allGroups, CfgGenAI, routes)

	// Decoys: the keys inside strings (escaped quotes), and nested deeper
	// than each dialect puts them.
	decoyMsgs := `[{"role": "system", "content": "reply as {\"model\": \"decoy\", \"usage\": {\"prompt_tokens\": 999}}"},` +
		` {"role": "user", "content": "a, \"model\": \"x\", \\\\\"model\": 1"}]`
	bigMsgs := `[{"role": "user", "content": "` + strings.Repeat("lorem ipsum ", 6000) + `"}, ` +
		`{"role": "user", "content": "` + strings.Repeat(`\"model\": \"no\" `, 400) + `"}]`
	// The walk's runs (gt_ga_run) skip string bytes eight at a time where
	// aligned and the bytes of containers no key of ours is in: escaped
	// quotes and backslashes at every offset of a word, brackets and keys
	// inside strings, decoy usage five levels down, whitespace and newlines
	// between every token of a pretty-printed body.
	var esc strings.Builder
	for k := 0; k < 17; k++ {
		esc.WriteString(`{"role": "user", "content": "` + strings.Repeat("a", k) + `\"model\": \"bad\", \\\\ [{]} \\\"usage\\\": 9"}, `)
	}
	runReq := "{\n\t\"messages\" :\n [" + esc.String() + `{"a": [[[{"usage": {"prompt_tokens": 5}}, "]", "\\"]]]}` + "] ,\n\t\"model\"\t:\t\"run-model\"\n}\n"
	runResp := "{\n  \"model\": \"run-model-1\",\n  \"choices\": [{\"message\": {\"content\": \"" + strings.Repeat(`x\"}`, 1100) +
		"\", \"usage\": {\"prompt_tokens\": 1}}}],\n  \"usage\": {\n    \"prompt_tokens\": 811,\n    \"completion_tokens\": 17\n  }\n}"
	for _, b := range []string{runReq, runResp} {
		if !json.Valid([]byte(b)) {
			t.Fatalf("the runs' body is not JSON: %.200s", b)
		}
	}
	chatReq := `{"messages": ` + decoyMsgs + `, "metadata": {"model": "nested"}, "model": "gpt-4o-mini"}`
	bigReq := `{"messages": ` + bigMsgs + `, "tools": [{"type": "function", "function": {"name": "model"}}], "model": "big-model"}`
	chatResp := `{"id": "c1", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18", "choices": [{"index": 0, ` +
		`"message": {"role": "assistant", "content": "\"usage\": {\"prompt_tokens\": 5}"}, "usage": {"prompt_tokens": 77}}], ` +
		`"usage": {"prompt_tokens": 123, "completion_tokens": 45, "total_tokens": 168, "prompt_tokens_details": {"cached_tokens": 3}}}`
	respResp := `{"id": "r1", "object": "response", "model": "o3", "output": [{"type": "message", "content": [{"type": "output_text", ` +
		`"text": "` + strings.Repeat("z", 70000) + `", "usage": {"input_tokens": 999}}]}], "metadata": {"model": "decoy"}, ` +
		`"usage": {"input_tokens": 4096, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 512, "total_tokens": 4608}}`
	msgResp := "{\n  \"id\": \"msg_1\",\n  \"type\": \"message\",\n  \"model\": \"claude-x\",\n  \"content\": [{\"type\": \"text\", \"text\": \"hi\"}],\n" +
		"  \"usage\": {\n    \"input_tokens\": 25,\n    \"cache_creation_input_tokens\": 7,\n    \"output_tokens\" : 15\n  }\n}\n"
	head := func(b string) string {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n", len(b))
	}
	chatSSE := []string{sseHead,
		chunk(sseEvent("", `{"id": "c2", "object": "chat.completion.chunk", "model": "m-stream", "choices": [{"delta": {"content": "\"usage\": {\"prompt_tokens\": 1}"}}], "usage": null}`)),
		chunk(sseEvent("", `{"id": "c2", "object": "chat.completion.chunk", "model": "m-stream", "choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 9}}`)),
		chunk(sseEvent("", `[DONE]`)), "0\r\n\r\n"}
	respSSE := []string{sseHead,
		chunk(sseEvent("response.created", `{"type": "response.created", "response": {"id": "r2", "model": "gpt-5", "usage": null}}`)),
		chunk(sseEvent("response.output_text.delta", `{"type": "response.output_text.delta", "delta": "\"usage\": {\"input_tokens\": 3}"}`)),
		chunk(sseEvent("response.completed", `{"type": "response.completed", "response": {"id": "r2", "model": "gpt-5", "output": [], `+
			`"usage": {"input_tokens": 640, "output_tokens": 64, "total_tokens": 704}}}`)), "0\r\n\r\n"}
	msgSSE := []string{sseHead,
		chunk(sseEvent("message_start", `{"type": "message_start", "message": {"id": "m1", "model": "claude-s", "usage": {"input_tokens": 250, "output_tokens": 1}}}`)),
		chunk(sseEvent("content_block_delta", `{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "{\"usage\": {\"output_tokens\": 7}}"}}`)),
		chunk(sseEvent("message_delta", `{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 150}}`)),
		chunk(sseEvent("message_stop", `{"type": "message_stop"}`)), "0\r\n\r\n"}
	// A token-by-token stream of 600 events written in one write, as a
	// server that fell behind flushes them (or a client reads them): 600
	// chunks in one syscall buffer, each walked (a step of gt_process each).
	var tokens strings.Builder
	tokens.WriteString(sseHead)
	for i := 0; i < 600; i++ {
		tokens.WriteString(chunk(sseEvent("", fmt.Sprintf(`{"id": "c9", "object": "chat.completion.chunk", "model": "m-tok", "choices": [{"delta": {"content": "t%d"}}]}`, i))))
	}
	tokens.WriteString(chunk(sseEvent("", `{"id": "c9", "model": "m-tok", "choices": [], "usage": {"prompt_tokens": 600, "completion_tokens": 600}}`)))
	tokens.WriteString(chunk(sseEvent("", `[DONE]`)) + "0\r\n\r\n")
	// A Content-Length body over 64 KiB written in pieces cut inside a key
	// and inside a number.
	k := strings.Index(respResp, `"usage": {"input_tokens": 4096`)
	n := strings.Index(respResp, `512`)
	respPieces := []string{head(respResp) + respResp[:k+3], respResp[k+3 : n+1], respResp[n+1:]}
	chunkedJSON := []string{"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
		chunk(msgResp[:40]), chunk(msgResp[40:]), "0\r\n\r\n"}

	cases := []struct {
		name   string
		path   string
		req    string
		splits []int
		parts  []string
		want   genaiWant
	}{
		{"chat JSON with decoys", "/v1/chat/completions", chatReq, nil, []string{head(chatResp) + chatResp},
			genaiWant{"gpt-4o-mini", "gpt-4o-mini-2024-07-18", 123, 45}},
		{"model after 80 KiB of messages, split writes", "/ng-rollout/t-1/v1/responses", bigReq, []int{100, 30000, 9},
			respPieces, genaiWant{"big-model", "o3", 4096, 512}},
		{"runs: escapes at every offset, brackets in strings, pretty", "/v1/chat/completions", runReq, []int{60, 1200}, []string{head(runResp) + runResp},
			genaiWant{"run-model", "run-model-1", 811, 17}},
		{"messages JSON pretty, chunked", "/v1/messages", `{"model":"claude-x","max_tokens":64,"messages":[]}`, nil,
			chunkedJSON, genaiWant{"claude-x", "claude-x", 25, 15}},
		{"chat SSE with include_usage", "/v1/chat/completions", `{"model": "m-stream", "stream": true}`, nil, chatSSE,
			genaiWant{"m-stream", "m-stream", 31, 9}},
		{"600 stream chunks in one write", "/v1/chat/completions", `{"model": "m-tok", "stream": true}`, nil, []string{tokens.String()},
			genaiWant{"m-tok", "m-tok", 600, 600}},
		{"responses SSE", "/v1/responses", `{"input": "hi", "model": "gpt-5", "stream": true}`, nil, respSSE,
			genaiWant{"gpt-5", "gpt-5", 640, 64}},
		{"messages SSE", "/v1/messages", `{"model": "claude-s", "stream": true}`, nil, msgSSE,
			genaiWant{"claude-s", "claude-s", 250, 150}},
		// Not sure: not recorded.
		{"duplicate top-level model", "/v1/chat/completions", `{"model": "a", "model": "b"}`, nil,
			[]string{jsonResp(`{"model": "a", "usage": {"prompt_tokens": 1, "completion_tokens": 2}}`)},
			genaiWant{"", "a", 1, 2}},
		{"escaped model, fractional count", "/v1/responses", `{"model": "a\/b"}`, nil,
			[]string{jsonResp(`{"model": "x", "usage": {"input_tokens": 1.5, "output_tokens": 2}}`)},
			genaiWant{"", "x", -1, 2}},
		{"model of 129 bytes, count as string", "/v1/messages", `{"model": "` + strings.Repeat("m", 129) + `"}`, nil,
			[]string{jsonResp(`{"model": "` + strings.Repeat("m", 128) + `", "usage": {"input_tokens": "1", "output_tokens": 2}}`)},
			genaiWant{"", strings.Repeat("m", 128), -1, 2}},
		{"chat stream without usage", "/v1/chat/completions", `{"model": "m", "stream": true}`, nil,
			[]string{sseHead, chunk(sseEvent("", `{"model": "m", "choices": []}`)), chunk(sseEvent("", "[DONE]")), "0\r\n\r\n"},
			genaiWant{"m", "m", -1, -1}},
		{"stream whose models disagree", "/v1/chat/completions", `{"model": "m"}`, nil,
			[]string{sseHead, chunk(sseEvent("", `{"model": "m1"}`)), chunk(sseEvent("", `{"model": "m2", "usage": {"prompt_tokens": 3, "completion_tokens": 4}}`)), "0\r\n\r\n"},
			genaiWant{"m", "", 3, 4}},
		{"not one JSON value", "/v1/chat/completions", `{"model": "m"} {"model": "n"}`, nil,
			[]string{jsonResp(`{"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 4}} x`)},
			genaiWant{"", "", -1, -1}},
		{"usage nested only", "/v1/chat/completions", `{"messages": [{"model": "n"}]}`, nil,
			[]string{jsonResp(`{"choices": [{"usage": {"prompt_tokens": 3}}], "x": {"usage": {"completion_tokens": 4}}}`)},
			genaiWant{"", "", -1, -1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, ok := genaiExchange(t, r, c.path, c.req, c.splits, c.parts...)
			want := c.want.have()
			if want == 0 {
				if ok {
					t.Fatalf("a record (have %#x), want none", g.Have)
				}
				return
			}
			if !ok {
				t.Fatalf("no GenAI record, want have %#x", want)
			}
			if g.Have != want {
				t.Errorf("have %#x, want %#x", g.Have, want)
			}
			if got := string(g.ReqModel[:g.ReqModelLen]); got != c.want.reqModel {
				t.Errorf("request model %q, want %q", got, c.want.reqModel)
			}
			if got := string(g.RespModel[:g.RespModelLen]); got != c.want.respModel {
				t.Errorf("response model %q, want %q", got, c.want.respModel)
			}
			if c.want.in >= 0 && int(g.InputTokens) != c.want.in {
				t.Errorf("input tokens %d, want %d", g.InputTokens, c.want.in)
			}
			if c.want.out >= 0 && int(g.OutputTokens) != c.want.out {
				t.Errorf("output tokens %d, want %d", g.OutputTokens, c.want.out)
			}
		})
	}

	// Every cut: a stream's last event, its chunk written in two pieces;
	// a Content-Length body in two writes; a request in two reads.
	final := sseEvent("", `{"id": "c3", "model": "m-split", "choices": [], "usage": {"prompt_tokens": 1234, "completion_tokens": 56}}`)
	jsonBody := `{"model": "m-cl", "usage": {"input_tokens": 98765, "output_tokens": 4321}}`
	reqBody := `{"messages": [{"content": "\"model\": \"no\""}], "model": "m-req"}`
	want := genaiWant{"m-split", "m-split", 1234, 56}
	bad := 0
	for cut := 1; cut < len(final); cut++ {
		parts := []string{sseHead, fmt.Sprintf("%x\r\n", len(final)) + final[:cut], final[cut:] + "\r\n", chunk(sseEvent("", "[DONE]")), "0\r\n\r\n"}
		g, ok := genaiExchange(t, r, "/v1/chat/completions", `{"model": "m-split"}`, nil, parts...)
		if !ok || g.Have != want.have() || g.InputTokens != 1234 || g.OutputTokens != 56 || string(g.RespModel[:g.RespModelLen]) != "m-split" {
			t.Errorf("SSE event cut at %d (%q): have %#x in %d out %d", cut, final[:cut], g.Have, g.InputTokens, g.OutputTokens)
			bad++
		}
	}
	for cut := 1; cut < len(jsonBody); cut++ {
		h := fmt.Sprintf("HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n", len(jsonBody))
		g, ok := genaiExchange(t, r, "/v1/responses", `{"model": "m-cl"}`, nil, h+jsonBody[:cut], jsonBody[cut:])
		if !ok || g.Have != 0xf || g.InputTokens != 98765 || g.OutputTokens != 4321 || string(g.RespModel[:g.RespModelLen]) != "m-cl" {
			t.Errorf("JSON body cut at %d (%q): have %#x in %d out %d", cut, jsonBody[:cut], g.Have, g.InputTokens, g.OutputTokens)
			bad++
		}
	}
	hlen := len(fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: model\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(reqBody)))
	for cut := 1; cut < len(reqBody); cut++ {
		g, ok := genaiExchange(t, r, "/v1/messages", reqBody, []int{hlen + cut}, jsonResp(`{"model": "m"}`))
		if !ok || g.Have&GenAIReqModel == 0 || string(g.ReqModel[:g.ReqModelLen]) != "m-req" {
			t.Errorf("request cut at %d (%q): have %#x model %q", cut, reqBody[:cut], g.Have, g.ReqModel[:g.ReqModelLen])
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d cuts read wrong", bad)
	}

	// Pipelining: the second request begins before the first answer, so
	// the first answer's values are not taken for either; the second
	// request's model still is.
	t.Run("pipelined", func(t *testing.T) {
		answered := make(chan struct{})
		addr := server(t, func(c net.Conn) {
			defer close(answered)
			br := bufio.NewReaderSize(c, 1<<16)
			for i := 0; i < 2; i++ {
				if _, err := readRequest(br); err != nil {
					return
				}
			}
			writeAll(t, c, jsonResp(`{"model": "r0", "usage": {"prompt_tokens": 1, "completion_tokens": 2}}`)+
				jsonResp(`{"model": "r1", "usage": {"prompt_tokens": 3, "completion_tokens": 4}}`))
		})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		req := func(m string) string {
			b := `{"model": "` + m + `"}`
			return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: model\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		}
		writeAll(t, c, req("q0")+req("q1"))
		br := bufio.NewReader(c)
		for i := 0; i < 2; i++ {
			if _, err := readResponse(br); err != nil {
				t.Fatal(err)
			}
		}
		<-answered
		r.settle()
		s := r.events(onConn(c, EvResponse, SideServer))
		if len(s) != 2 {
			t.Fatalf("server responses: %d, want 2 (%s)", len(s), r.connRecords(c))
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		n := 0
		for _, g := range r.ga {
			if g.ConnId != s[0].ConnId {
				continue
			}
			n++
			if g.Seq != 1 || g.Have != GenAIReqModel || string(g.ReqModel[:g.ReqModelLen]) != "q1" {
				t.Errorf("pipelined: a record seq %d have %#x req %q resp %q", g.Seq, g.Have, g.ReqModel[:g.ReqModelLen], g.RespModel[:g.RespModelLen])
			}
		}
		if n != 1 {
			t.Errorf("pipelined: %d records, want 1 (the second request's model)", n)
		}
	})

	t.Run("flag off", func(t *testing.T) {
		r.setGate(allGroups, 0)
		defer r.setGate(allGroups, CfgGenAI)
		if g, ok := genaiExchange(t, r, "/v1/chat/completions", chatReq, nil, head(chatResp)+chatResp); ok {
			t.Errorf("a record without CfgGenAI: have %#x", g.Have)
		}
	})
	t.Run("model_call and rollout off", func(t *testing.T) {
		r.setGate(allGroups&^(groupModelCall|groupRollout), CfgGenAI)
		defer r.setGate(allGroups, CfgGenAI)
		if g, ok := genaiExchange(t, r, "/v1/chat/completions", chatReq, nil, head(chatResp)+chatResp); ok {
			t.Errorf("a record with model_call and rollout off: have %#x", g.Have)
		}
	})
	t.Run("rollout alone", func(t *testing.T) {
		r.setGate(groupServer|groupRollout, CfgGenAI)
		defer r.setGate(allGroups, CfgGenAI)
		if _, ok := genaiExchange(t, r, "/v1/chat/completions", chatReq, nil, head(chatResp)+chatResp); !ok {
			t.Errorf("no record with rollout on: the rollout's totals need it")
		}
	})
}
