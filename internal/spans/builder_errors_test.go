//go:build linux

package spans

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

func TestCloseWithPendingAndStatusRules(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/boom").respond(500)
	c.request(loader.MethodPOST, "/slow")
	c.closeSide(pidResources, false)
	c.closeSide(pidAgent, true)

	byDesc := map[string]Span{}
	for _, sp := range s.spans {
		byDesc[desc(sp)] = sp
	}
	check := func(d string, want codes.Code, errType string) {
		t.Helper()
		sp, ok := byDesc[d]
		if !ok {
			t.Fatalf("no span %s in %v", d, edges(t, s.spans))
		}
		if sp.Status != want {
			t.Errorf("%s: status %v, want %v", d, sp.Status, want)
		}
		if errType == "" {
			noAttr(t, sp, "error.type")
		} else {
			mustAttr(t, sp, "error.type", errType)
		}
	}
	// A 5xx is ERROR on the server span and not on the client span.
	check("weather:POST /boom", codes.Error, "500")
	check("simple_agent:HTTP POST ->resources/boom", codes.Unset, "")
	// No response at all: a connection error on both ends.
	check("weather:POST /slow", codes.Error, "connection_closed")
	check("simple_agent:HTTP POST ->resources/slow", codes.Error, "connection_reset")
	noAttr(t, byDesc["weather:POST /slow"], "http.response.status_code")
	if st := s.p.Stats().Assembler; st.Failed != 2 || st.OpenConns != 0 {
		t.Errorf("assembler stats %+v", st)
	}
}

func TestResetMidResponseIsClientError(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/x").respondFlags(200, 0, loader.FlagConnError)
	for _, sp := range s.spans {
		if sp.Kind == trace.SpanKindClient && sp.Status != codes.Error {
			t.Errorf("client span of a reset response: %v", sp.Status)
		}
		if sp.Kind == trace.SpanKindServer && sp.Status != codes.Unset {
			t.Errorf("server span whose response was written: %v", sp.Status)
		}
	}
}

func TestFlushTruncates(t *testing.T) {
	s := newSim(t, "per_rollout")
	g := newGymStack(s, false)
	g.collAgent[0].request(loader.MethodPOST, "/run", withRollout(2, 0, -1))
	g.agentMod[0].request(loader.MethodPOST, "/v1/responses")
	if len(s.spans) != 0 {
		t.Fatal("spans before anything ended")
	}
	out := s.p.Flush()
	diffEdges(t, edges(t, out), []string{
		e(aRun, ""), e(aRollout, aRun),
		e("simple_agent:HTTP POST ->model/v1/responses", aRollout),
		e(mResp, "simple_agent:HTTP POST ->model/v1/responses"),
		e(mGym, mResp),
	})
	for _, sp := range out {
		mustAttr(t, sp, "nemo.span.truncated", true)
		if sp.Status != codes.Unset {
			t.Errorf("%s: truncated span has status %v", desc(sp), sp.Status)
		}
	}
	if st := s.p.Stats(); st.Builder.OpenServer+st.Builder.OpenClient != 0 || st.Assembler.OpenConns != 0 {
		t.Errorf("state after Flush: %+v", st)
	}
	if len(s.p.Flush()) != 0 {
		t.Error("second Flush returned spans")
	}
}

func TestExpireEndsStaleExchangesAsTruncated(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.p = NewPipeline(http.NewAssembler(http.AssemblerOptions{MaxAge: time.Millisecond}), s.b)
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/hang")
	out := s.p.Expire(s.now + uint64(time.Second))
	if len(out) != 2 {
		t.Fatalf("Expire returned %d spans, want client and server", len(out))
	}
	for _, sp := range out {
		mustAttr(t, sp, "nemo.span.truncated", true)
	}
	if st := s.p.Stats(); st.Assembler.Evicted != 2 || st.Builder.Truncated != 2 || st.Builder.OpenServer+st.Builder.OpenClient != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPipelineCountsDecodeErrors(t *testing.T) {
	s := newSim(t, "default")
	if _, err := s.p.Process([]byte{1, 2, 3}); err == nil {
		t.Fatal("a 3-byte record decoded")
	}
	if s.p.Stats().DecodeErrors != 1 {
		t.Error("decode error not counted")
	}
}
