//go:build linux

package tls

import (
	"testing"
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/tls/testbpf"
)

// What upstream's /v1/responses answers: a model and token counts, with the
// same keys as decoys inside a string and one level too deep.
const upstreamResponses = `{"id": "r1", "object": "response", "model": "up-model", "output": [{"type": "message", ` +
	`"content": [{"type": "output_text", "text": "\"usage\": {\"input_tokens\": 7}", "usage": {"input_tokens": 9}}]}], ` +
	`"usage": {"input_tokens": 321, "output_tokens": 54, "total_tokens": 375}}`

// A model server's calls upstream over HTTPS (issue 40: "often HTTPS"): the
// TLS programs hand the plaintext to the parser the syscalls feed, which
// walks the model exchange's bodies. Each call's request model and the
// answer's model and token counts reach userspace in one GenAI record for
// that request, as over plain HTTP (internal/loader TestGenAIClientWalk),
// and nothing else of the bodies.
func TestKernelGenAIUpstreamTLS(t *testing.T) {
	k, u, a := withUpstream(t)
	k.gate(t, groups.MaskOf(groups.Server, groups.HTTPClient, groups.ModelCall), 1, loader.CfgGenAI)
	rk := loader.NewRouteKey(loader.RoleModel, loader.MethodPOST, "/v1/responses")
	if err := k.objs.GtRoutes.Put(&rk, uint64(groups.ModelCall.Mask())); err != nil {
		t.Fatal(err)
	}
	py := startPyClient(t, u.ca)
	k.target(t, py.pid)
	if err := k.objs.GtTargets.Put(uint32(py.pid), testbpf.Target{Role: loader.RoleModel}); err != nil {
		t.Fatal(err)
	}
	py.do(t, "import", "imported")
	if err := a.Add(py.pid); err != nil {
		t.Fatal(err)
	}
	py.do(t, "aiohttp "+u.url("/v1/responses")+" 2", "done 200")

	var reqs []testbpf.Event
	for _, e := range k.take(py.pid) {
		if e.ev.Kind == testbpf.EvRequest && e.ev.Flags&testbpf.FlagTLS != 0 {
			reqs = append(reqs, e.ev)
		}
	}
	recs := k.genai(py.pid)
	if len(reqs) != 2 || len(recs) != 2 {
		t.Fatalf("%d TLS requests and %d GenAI records, want 2 and 2", len(reqs), len(recs))
	}
	for i, g := range recs {
		if g.ConnId != reqs[i].ConnId || g.Seq != reqs[i].Seq {
			t.Errorf("record %d names request %d/%d, want %d/%d", i, g.ConnId, g.Seq, reqs[i].ConnId, reqs[i].Seq)
		}
		req, resp := string(g.ReqModel[:g.ReqModelLen]), string(g.RespModel[:g.RespModelLen])
		if g.Have != 0xf || req != "m" || resp != "up-model" || g.InputTokens != 321 || g.OutputTokens != 54 {
			t.Errorf("record %d: have %#x, models %q/%q, tokens %d/%d; want 0xf, m/up-model, 321/54",
				i, g.Have, req, resp, g.InputTokens, g.OutputTokens)
		}
	}
}

// genai takes the GenAI records of pid (k.take keeps HTTP records).
func (k *kernel) genai(pid int) []loader.GenAIEvent {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []loader.GenAIEvent
	var rest []rawEvent
	for _, e := range k.events {
		if len(e.raw) >= loader.GenAIEventSize && e.raw[0] == testbpf.EvGenAI {
			var g loader.GenAIEvent
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&g)), loader.GenAIEventSize), e.raw)
			if int(g.Pid) == pid {
				out = append(out, g)
				continue
			}
		}
		rest = append(rest, e)
	}
	k.events = rest
	return out
}
