//go:build linux

package http

import (
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// GenAI is what the kernel read from a model exchange's bodies (server side,
// bpf/http_genai.h): the request's and the response's model names and the
// response's token counts. Each value is there only when the kernel read it
// for sure; nothing else of the bodies reaches userspace.
type GenAI struct {
	Dialect   string // "chat_completions", "responses" or "messages"
	ReqModel  string // "" when not read
	RespModel string
	Input     int // tokens; valid when HasInput
	Output    int
	HasInput  bool
	HasOutput bool
	Stream    bool // the response was an SSE stream
}

// Dialect names, as Gym's nemo.gym.model.dialect spells them.
const (
	DialectChat      = "chat_completions"
	DialectResponses = "responses"
	DialectMessages  = "messages"
)

const modelMax = len(loader.GenAIEvent{}.ReqModel)

// DecodeGenAI reads a GenAI record (loader.EvGenAI). ok is false when the
// record is short or its fields are out of bounds; a model name that is not
// printable ASCII is dropped (the kernel keeps only such names).
func DecodeGenAI(raw []byte) (ev loader.GenAIEvent, g GenAI, ok bool) {
	if len(raw) < loader.GenAIEventSize || raw[0] != loader.EvGenAI {
		return ev, g, false
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), loader.GenAIEventSize), raw)
	switch ev.Dialect {
	case loader.DialectChat:
		g.Dialect = DialectChat
	case loader.DialectResponses:
		g.Dialect = DialectResponses
	case loader.DialectMessages:
		g.Dialect = DialectMessages
	default:
		return ev, g, false
	}
	if ev.Have&loader.GenAIReqModel != 0 {
		g.ReqModel = modelName(ev.ReqModel[:], int(ev.ReqModelLen))
	}
	if ev.Have&loader.GenAIRespModel != 0 {
		g.RespModel = modelName(ev.RespModel[:], int(ev.RespModelLen))
	}
	if ev.Have&loader.GenAIInput != 0 {
		g.Input, g.HasInput = int(ev.InputTokens), true
	}
	if ev.Have&loader.GenAIOutput != 0 {
		g.Output, g.HasOutput = int(ev.OutputTokens), true
	}
	g.Stream = ev.Sse != 0
	return ev, g, true
}

// modelName is b[:n] when that is 1 to 128 bytes of printable ASCII.
func modelName(b []byte, n int) string {
	if n <= 0 || n > modelMax || n > len(b) {
		return ""
	}
	for _, c := range b[:n] {
		if c < 0x20 || c > 0x7e {
			return ""
		}
	}
	return string(b[:n])
}

// AddGenAI attaches a GenAI record's values to the request it names, which
// waits for its response: the kernel emits the record just before the
// response record. A record whose request is not waiting (its record was
// lost) is counted and dropped.
func (a *Assembler) AddGenAI(connID, seq uint64, g GenAI) {
	a.st.GenAI++
	c := a.conns[connID]
	if c != nil {
		for _, x := range c.q {
			if x.Seq == seq {
				v := g
				x.GenAI = &v
				return
			}
		}
	}
	a.st.GenAIOrphans++
}
