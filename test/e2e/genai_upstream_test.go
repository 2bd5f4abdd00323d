//go:build linux

package e2e

// A model server's own calls upstream, end to end (issue 40): with
// launch.py --model-upstream the stack's model server forwards each of the
// agent's model calls to a fake upstream LLM (test/stack/upstream.py, not
// traced) before answering, in the call's form (every dialect, JSON and SSE,
// small and over 64 KiB both ways, one write, cut writes, chunked; every odd
// turn under /ng-rollout/<id>), asking for "u-" + the call's model, and the
// upstream answers with genai.expected() of that. gymtrace must put the
// upstream's exact values on every upstream CLIENT span (marked
// nemo.gym.model.upstream), leave the model server's SERVER-side values and
// every rollout's sums as they are without the upstream, and keep the
// upstream out of the GenAI and rollout metrics: 0 wrong, 0 missing.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestGenAIUpstream(t *testing.T) {
	needRoot(t)
	needStack(t)
	for _, c := range []struct {
		name, loop, http, groups string
	}{
		{"py3.11_asyncio_h11", "asyncio", "h11", "per_rollout"},
		{"py3.11_uvloop_httptools", "uvloop", "httptools", "per_rollout"},
		// model_call off: the SERVER-side values go on the model's SERVER
		// spans; the upstream CLIENT spans get theirs all the same.
		{"py3.11_uvloop_default", "uvloop", "httptools", "default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			runGenAIUpstream(t, []string{"--model-upstream", "--loop", c.loop, "--http", c.http}, c.groups)
		})
	}
}

// genaiDialectOf is the dialect a model route's path names.
func genaiDialectOf(path string) string {
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return "chat_completions"
	case strings.HasSuffix(path, "/v1/messages"):
		return "messages"
	case strings.HasSuffix(path, "/v1/responses"):
		return "responses"
	}
	return ""
}

func runGenAIUpstream(t *testing.T, stackArgs []string, groups string) {
	const n, conc, turns = 24, 4, 3
	st := startStack(t, t, stackArgs...)
	if st.server("upstream").PID == 0 {
		t.Fatal("launch.py --model-upstream started no upstream")
	}
	sk := startSink(t)
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: groups, otlp: sk.endpoint(),
		env: []string{"OTEL_METRIC_EXPORT_INTERVAL=500"}})
	sum := st.collect(t, n, conc, true, "--turns", fmt.Sprint(turns), "--genai")
	agent, model := st.server("agent").PID, st.server("model").PID
	calls := n * turns
	perRollout := groups == "per_rollout"

	var wantIn, wantOut int
	for _, rid := range sum.RolloutIDs {
		for k := 0; k < turns; k++ {
			_, in, out := genaiExpected(genaiModelName(rid, k))
			wantIn, wantOut = wantIn+in, wantOut+out
		}
	}
	// The metrics count the SERVER side only.
	waitFor(t, 20*time.Second, "gymtrace's metrics to count every rollout", func() bool {
		fams := promScrape(t, gt.metricsAddr)
		c, _ := promHist(fams, "gym_rollout_input_tokens", agent)
		return c >= n
	})
	fams := promScrape(t, gt.metricsAddr)
	if c, s := promHist(fams, "gym_rollout_input_tokens", agent); c != n || int(s) != wantIn {
		t.Errorf("gym.rollout.input_tokens: %d rollouts, sum %v; want %d, %d", c, s, n, wantIn)
	}
	if c, s := promHist(fams, "gym_rollout_output_tokens", agent); c != n || int(s) != wantOut {
		t.Errorf("gym.rollout.output_tokens: %d rollouts, sum %v; want %d, %d", c, s, n, wantOut)
	}
	if c, s := promHist(fams, "gym_agent_turn_count", agent); c != n || int(s) != calls {
		t.Errorf("gym.agent.turn_count: %d rollouts, sum %v; want %d, %d", c, s, n, calls)
	}
	if c, _ := promHist(fams, "gym_agent_turn_duration_ms_milliseconds", agent); c != uint64(n*(turns-1)) {
		t.Errorf("gym.agent.turn_duration_ms: %d gaps, want %d", c, n*(turns-1))
	}
	if perRollout {
		waitFor(t, 20*time.Second, "gymtrace's metrics to count every model call", func() bool {
			c, _ := promHist(promScrape(t, gt.metricsAddr), "gen_ai_client_operation_duration_seconds", model)
			return c >= uint64(calls)
		})
		fams = promScrape(t, gt.metricsAddr)
		if c, s := promHist(fams, "gen_ai_client_token_usage", model); c != uint64(2*calls) || int(s) != wantIn+wantOut {
			t.Errorf("gen_ai.client.token.usage: %d values, sum %v; want %d, %d (the SERVER side's only)",
				c, s, 2*calls, wantIn+wantOut)
		}
		if c, _ := promHist(fams, "gen_ai_client_operation_duration_seconds", model); c != uint64(calls) {
			t.Errorf("gen_ai.client.operation.duration: %d calls, want %d", c, calls)
		}
	} else if c, _ := promHist(fams, "gen_ai_client_token_usage", model); c != 0 {
		t.Errorf("gen_ai.client.token.usage made with model_call off: %d values", c)
	}
	checkSinkRolloutTokens(t, sk.out, agent, n, wantIn, wantOut)
	m := gt.settle(t, 1)
	gt.shutdown(t)
	// Both ends of every call, four fields each: read.
	if v := m[`gymtrace_kernel_events_total{reason="genai_read"}`]; v != float64(8*calls) {
		t.Errorf("genai_read = %v, want %d (4 fields of the SERVER and the upstream CLIENT exchange of %d calls)", v, 8*calls, calls)
	}
	for _, r := range []string{"genai_ambiguous", "genai_malformed", "genai_incomplete", "genai_absent"} {
		for k, v := range m {
			if strings.Contains(k, `reason="`+r+`"`) && v != 0 {
				t.Errorf("%s = %v: every field of every model exchange, both sides, must be read", k, v)
			}
		}
	}

	spans := newSpanSet(readSpans(t, sk.out))
	// The upstream CLIENT spans: the upstream's exact values.
	seen := map[string]bool{}
	var up, upWrong, upMissing, prefixed int
	for _, s := range spans.filter(func(s Span) bool { return s.PID() == model && s.Kind == "CLIENT" }) {
		req := s.Attr("gen_ai.request.model")
		rm, in, out := genaiExpected(req)
		provider := "openai"
		if genaiDialectOf(s.Path()) == "messages" {
			provider = "anthropic"
		}
		switch {
		case req == "" || s.Attr("gen_ai.response.model") == "" || s.Attributes["gen_ai.usage.input_tokens"] == nil ||
			s.Attributes["gen_ai.usage.output_tokens"] == nil:
			upMissing++
			t.Errorf("an upstream call without every GenAI value: %v %v", s, s.Attributes)
		case !strings.HasPrefix(req, "u-m-") || s.Attr("gen_ai.response.model") != rm ||
			s.AttrInt("gen_ai.usage.input_tokens") != in || s.AttrInt("gen_ai.usage.output_tokens") != out ||
			s.Attr("gen_ai.operation.name") != "chat" || s.Attr("gen_ai.provider.name") != provider ||
			s.Attr("nemo.gym.model.upstream") != "true" || seen[req]:
			upWrong++
			t.Errorf("wrong upstream GenAI values: %v %v (want response model %q, %d in, %d out, %s)",
				s, s.Attributes, rm, in, out, provider)
		default:
			up++
		}
		if strings.HasPrefix(s.Path(), "/ng-rollout/") {
			prefixed++
		}
		seen[req] = true
	}
	// The model server's SERVER side: as without the upstream.
	callName := func(s Span) bool { return strings.HasPrefix(s.Name, "gym.model.") }
	if !perRollout {
		callName = func(s Span) bool { return s.PID() == model && s.Kind == "SERVER" && s.Attr("http.route") != "/" }
	}
	var good, wrong int
	for _, s := range spans.filter(callName) {
		req := s.Attr("gen_ai.request.model")
		rm, in, out := genaiExpected(req)
		if !strings.HasPrefix(req, "m-"+s.Attr("nemo.gym.rollout.id")+"-t") || s.Attr("gen_ai.response.model") != rm ||
			s.AttrInt("gen_ai.usage.input_tokens") != in || s.AttrInt("gen_ai.usage.output_tokens") != out ||
			s.Attributes["nemo.gym.model.upstream"] != nil {
			wrong++
			t.Errorf("wrong SERVER-side GenAI values: %v %v", s, s.Attributes)
		} else {
			good++
		}
	}
	// Nothing else carries GenAI values (the agent's CLIENT calls to the
	// model server among them).
	for _, s := range spans.all {
		if s.Attributes["gen_ai.request.model"] != nil && !callName(s) && !(s.PID() == model && s.Kind == "CLIENT") {
			wrong++
			t.Errorf("GenAI values on %v %v", s, s.Attributes)
		}
	}
	// Every rollout: the SERVER side's sums, the upstream's never added.
	var rGood, rWrong int
	for _, s := range spans.filter(func(s Span) bool { return s.Name == "gym.rollout" }) {
		rid := s.Attr("nemo.gym.rollout.id")
		var in, out int
		for k := 0; k < turns; k++ {
			_, i, o := genaiExpected(genaiModelName(rid, k))
			in, out = in+i, out+o
		}
		if s.AttrInt("nemo.gym.rollout.model_calls") != turns || s.AttrInt("nemo.gym.rollout.input_tokens") != in ||
			s.AttrInt("nemo.gym.rollout.output_tokens") != out {
			rWrong++
			t.Errorf("rollout %s: %v, want %d calls, %d in, %d out", rid, s.Attributes, turns, in, out)
		} else {
			rGood++
		}
	}
	t.Logf("upstream calls: %d exact, %d wrong, %d missing of %d (%d under /ng-rollout/); model calls: %d exact, %d wrong of %d; "+
		"rollouts: %d exact sums, %d wrong of %d", up, upWrong, upMissing, calls, prefixed, good, wrong, calls, rGood, rWrong, n)
	if up != calls || good != calls || rGood != n || prefixed == 0 || prefixed == calls {
		t.Errorf("%d of %d upstream calls, %d of %d model calls and %d of %d rollouts exact; %d upstream calls prefixed",
			up, calls, good, calls, rGood, n, prefixed)
	}
}
