//go:build linux

package http

import (
	"testing"
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/loader"
)

func genaiRaw(conn, seq uint64, dialect, have uint8, req, resp string, in, out uint32) []byte {
	ev := loader.GenAIEvent{Kind: loader.EvGenAI, Dialect: dialect, Have: have, ConnId: conn, Seq: seq,
		InputTokens: in, OutputTokens: out}
	ev.ReqModelLen = uint16(copy(ev.ReqModel[:], req))
	ev.RespModelLen = uint16(copy(ev.RespModel[:], resp))
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.GenAIEventSize)...)
}

func TestDecodeGenAI(t *testing.T) {
	all := loader.GenAIReqModel | loader.GenAIRespModel | loader.GenAIInput | loader.GenAIOutput
	_, g, ok := DecodeGenAI(genaiRaw(1, 2, loader.DialectMessages, all, "claude", "claude-x", 25, 15))
	if !ok || g != (GenAI{Dialect: DialectMessages, ReqModel: "claude", RespModel: "claude-x", Input: 25, Output: 15,
		HasInput: true, HasOutput: true}) {
		t.Errorf("decoded %+v (ok %v)", g, ok)
	}
	// Only what the record says it holds; a name that is not printable is dropped.
	_, g, ok = DecodeGenAI(genaiRaw(1, 2, loader.DialectChat, loader.GenAIRespModel|loader.GenAIInput, "ignored", "a\x01b", 7, 9))
	if !ok || g.ReqModel != "" || g.RespModel != "" || !g.HasInput || g.Input != 7 || g.HasOutput {
		t.Errorf("decoded %+v (ok %v)", g, ok)
	}
	if _, _, ok := DecodeGenAI(genaiRaw(1, 2, 9, all, "m", "m", 1, 1)); ok {
		t.Error("an unknown dialect decoded")
	}
	if _, _, ok := DecodeGenAI(genaiRaw(1, 2, loader.DialectChat, all, "m", "m", 1, 1)[:20]); ok {
		t.Error("a short record decoded")
	}
	raw := genaiRaw(1, 2, loader.DialectChat, all, "m", "m", 1, 1)
	raw[int(unsafe.Offsetof(loader.GenAIEvent{}.ReqModelLen))] = 200 // past the 128 bytes
	if _, g, ok := DecodeGenAI(raw); !ok || g.ReqModel != "" {
		t.Errorf("a model length past its field gave %q", g.ReqModel)
	}
}

// The record attaches to the request it names while it waits; one naming
// no waiting request is counted and dropped.
func TestAssemblerGenAI(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/v1/responses", 10), r)
	a.Add(reqEv(1, 1, "/v1/responses", 20), r)
	a.AddGenAI(1, 1, GenAI{Dialect: DialectResponses, RespModel: "o3", Output: 5, HasOutput: true})
	a.AddGenAI(1, 7, GenAI{Dialect: DialectResponses})
	a.AddGenAI(2, 0, GenAI{Dialect: DialectResponses})
	a.Add(respEv(1, 0, 200, 30, 0), r)
	a.Add(respEv(1, 1, 200, 40, 0), r)
	if len(r.done) != 2 || r.done[0].GenAI != nil || r.done[1].GenAI == nil || r.done[1].GenAI.RespModel != "o3" {
		t.Fatalf("done %d, GenAI %v %v", len(r.done), r.done[0].GenAI, r.done[1].GenAI)
	}
	if st := a.Stats(); st.GenAI != 3 || st.GenAIOrphans != 2 {
		t.Errorf("stats %+v, want 3 GenAI records, 2 orphans", st)
	}
}
