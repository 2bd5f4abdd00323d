//go:build linux

package e2e

// Tokens per rollout, end to end (issue 40): the stack's model server answers
// every call with a model and token counts that are functions of the
// request's model name (test/stack/genai.py), in every dialect and form (JSON
// and SSE, small and over 64 KiB both ways, one write, writes cut inside keys
// and numbers, chunked, with decoys). gymtrace must put the exact values on
// every model call's span and the exact sums on every gym.rollout span, and
// Gym's metrics must add up to them: 0 wrong, 0 missing.

import (
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// genaiExpected mirrors test/stack/genai.py expected().
func genaiExpected(reqModel string) (model string, in, out int) {
	c := crc32.ChecksumIEEE([]byte(reqModel))
	return reqModel + "-r", 100 + int(c%100000), 1 + int((c>>17)%5000)
}

const (
	gymRolloutInput  = "gym.rollout.input_tokens"
	gymRolloutOutput = "gym.rollout.output_tokens"
)

func genaiModelName(rolloutID string, turn int) string {
	return fmt.Sprintf("m-%s-t%d", rolloutID, turn)
}

func TestGenAITokens(t *testing.T) {
	needRoot(t)
	needStack(t)
	for _, c := range []struct {
		name   string
		root   *chrootPy
		loop   string
		groups string
	}{
		{"py3.11_asyncio_h11", nil, "asyncio", "per_rollout"},
		{"py3.11_uvloop_httptools", nil, "uvloop", "per_rollout"},
		// model_call off: the values go on the model's SERVER spans, and
		// the rollouts still get their totals.
		{"py3.11_uvloop_default", nil, "uvloop", "default"},
		{"py3.14_uvloop_httptools", sid, "uvloop", "per_rollout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var launch []string
			if r := c.root; r != nil {
				if why := r.missing(); why != "" {
					t.Skip(why)
				}
				dir, err := r.stackDir()
				if err != nil {
					t.Fatal(err)
				}
				launch = []string{"--python", "chroot " + r.root + " " + r.python, "--stack-dir", dir}
			}
			http := "h11"
			if c.loop == "uvloop" {
				http = "httptools"
			}
			runGenAI(t, append(launch, "--loop", c.loop, "--http", http), c.groups)
		})
	}
}

// TestGenAIOff: --genai=false reads nothing: no gen_ai.* attribute, no
// rollout sums, no GenAI counter moves; the spans are all there.
func TestGenAIOff(t *testing.T) {
	needRoot(t)
	needStack(t)
	const n, turns = 6, 3
	st := startStack(t, t, "--loop", "uvloop", "--http", "httptools")
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: "per_rollout", jsonl: out, extra: []string{"--genai=false"}})
	st.collect(t, n, 2, true, "--turns", fmt.Sprint(turns), "--genai")
	m := gt.settle(t, 1)
	gt.shutdown(t)
	for k, v := range m {
		if strings.Contains(k, `reason="genai_`) && v != 0 {
			t.Errorf("%s = %v with --genai=false", k, v)
		}
	}
	spans := newSpanSet(readSpans(t, out))
	calls, rollouts := 0, 0
	for _, s := range spans.all {
		for k := range s.Attributes {
			if strings.HasPrefix(k, "gen_ai.") || strings.HasSuffix(k, "_tokens") {
				t.Errorf("%s on %v with --genai=false", k, s)
			}
		}
		if strings.HasPrefix(s.Name, "gym.model.") {
			calls++
		}
		if s.Name == "gym.rollout" {
			rollouts++
			if s.AttrInt("nemo.gym.rollout.model_calls") != turns {
				t.Errorf("rollout without its call count: %v", s.Attributes)
			}
		}
	}
	if calls != n*turns || rollouts != n {
		t.Errorf("%d model calls and %d rollouts, want %d and %d", calls, rollouts, n*turns, n)
	}
}

func runGenAI(t *testing.T, stackArgs []string, groups string) {
	const n, conc, turns = 24, 4, 3
	st := startStack(t, t, stackArgs...)
	sk := startSink(t)
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: groups, otlp: sk.endpoint(),
		env: []string{"OTEL_METRIC_EXPORT_INTERVAL=500"}})
	sum := st.collect(t, n, conc, true, "--turns", fmt.Sprint(turns), "--genai")
	agent, model, res := st.server("agent").PID, st.server("model").PID, st.server("resources").PID

	// Gym's metrics reach the expected counts on Prometheus before shutdown.
	var wantIn, wantOut int
	for _, rid := range sum.RolloutIDs {
		for k := 0; k < turns; k++ {
			_, in, out := genaiExpected(genaiModelName(rid, k))
			wantIn, wantOut = wantIn+in, wantOut+out
		}
	}
	calls := n * turns
	perRollout := groups == "per_rollout"
	waitFor(t, 20*time.Second, "gymtrace's metrics to count every rollout", func() bool {
		fams := promScrape(t, gt.metricsAddr)
		c, _ := promHist(fams, "gym_rollout_input_tokens", agent)
		m := uint64(calls)
		if perRollout {
			m, _ = promHist(fams, "gym_model_call_duration_ms_milliseconds", model)
		}
		return c >= n && m >= uint64(calls)
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
	if ms := promOf(fams, "gym_rollout_completed_total", agent); len(ms) != 1 || ms[0].GetCounter().GetValue() != n ||
		!hasLabel(ms[0].GetLabel(), "nemo_gym_rollout_outcome", "success") {
		t.Errorf("gym.rollout.completed_total: %v, want one series outcome=success at %d", ms, n)
	}
	if c, _ := promHist(fams, "gym_tool_call_duration_ms_milliseconds", res); c != uint64(n*(turns+1)) {
		t.Errorf("gym.tool.call_duration_ms: %d calls, want %d (get_weather)", c, n*(turns+1))
	}
	if perRollout {
		if c, s := promHist(fams, "gen_ai_client_token_usage", model); c != uint64(2*calls) || int(s) != wantIn+wantOut {
			t.Errorf("gen_ai.client.token.usage: %d values, sum %v; want %d, %d", c, s, 2*calls, wantIn+wantOut)
		}
		if c, _ := promHist(fams, "gen_ai_client_operation_duration_seconds", model); c != uint64(calls) {
			t.Errorf("gen_ai.client.operation.duration: %d calls, want %d", c, calls)
		}
		if c, _ := promHist(fams, "gym_model_time_to_first_byte_ms_milliseconds", model); c != uint64(calls) {
			t.Errorf("gym.model.time_to_first_byte_ms: %d calls, want %d", c, calls)
		}
	} else if c, _ := promHist(fams, "gen_ai_client_token_usage", model); c != 0 {
		t.Errorf("gen_ai.client.token.usage made with model_call off: %d values", c)
	}
	// OTLP: the sink's metrics service received the same sums.
	checkSinkRolloutTokens(t, sk.out, agent, n, wantIn, wantOut)
	gt.settle(t, 1)
	gt.shutdown(t)

	// Every model call: its exact values.
	spans := newSpanSet(readSpans(t, sk.out))
	callName := func(s Span) bool { return strings.HasPrefix(s.Name, "gym.model.") }
	if !perRollout {
		callName = func(s Span) bool { return s.PID() == model && s.Kind == "SERVER" && s.Attr("http.route") != "/" }
	}
	seen := map[string]bool{}
	var good, wrong, missing int
	for _, s := range spans.filter(callName) {
		rid := s.Attr("nemo.gym.rollout.id")
		req := s.Attr("gen_ai.request.model")
		model, in, out := genaiExpected(req)
		switch {
		case req == "" || s.Attr("gen_ai.response.model") == "" || s.Attributes["gen_ai.usage.input_tokens"] == nil ||
			s.Attributes["gen_ai.usage.output_tokens"] == nil:
			missing++
			t.Errorf("a model call without every GenAI value: %v %v", s, s.Attributes)
		case !strings.HasPrefix(req, "m-"+rid+"-t") || s.Attr("gen_ai.response.model") != model ||
			s.AttrInt("gen_ai.usage.input_tokens") != in || s.AttrInt("gen_ai.usage.output_tokens") != out ||
			s.Attr("gen_ai.operation.name") != "chat" || s.Attr("gen_ai.provider.name") == "" || seen[req]:
			wrong++
			t.Errorf("wrong GenAI values: %v %v (want response model %q, %d in, %d out)", s, s.Attributes, model, in, out)
		default:
			good++
		}
		seen[req] = true
	}
	// Every rollout: its exact sums.
	var rGood, rWrong int
	rollouts := spans.filter(func(s Span) bool { return s.Name == "gym.rollout" })
	for _, s := range rollouts {
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
	t.Logf("model calls: %d exact, %d wrong, %d missing of %d; rollouts: %d exact sums, %d wrong of %d (%d input, %d output tokens)",
		good, wrong, missing, calls, rGood, rWrong, n, wantIn, wantOut)
	if good != calls || rGood != n {
		t.Errorf("%d of %d model calls and %d of %d rollouts exact", good, calls, rGood, n)
	}
}

func hasLabel[L interface {
	GetName() string
	GetValue() string
}](ls []L, name, value string) bool {
	for _, l := range ls {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// checkSinkRolloutTokens: the OTLP sink's metrics (beside its spans file
// out) reach n rollouts for agent, summing to wantIn and wantOut tokens.
func checkSinkRolloutTokens(t *testing.T, out string, agent int, n uint64, wantIn, wantOut int) {
	t.Helper()
	sinkOut := strings.TrimSuffix(out, filepath.Ext(out)) + ".metrics.jsonl"
	var pts map[string]map[int]sinkPoint
	waitFor(t, 20*time.Second, "the OTLP sink to receive every rollout's token sums", func() bool {
		pts = sinkLatest(t, sinkOut)
		return pts[gymRolloutInput][agent].Count >= n && pts[gymRolloutOutput][agent].Count >= n
	})
	for name, want := range map[string]int{gymRolloutInput: wantIn, gymRolloutOutput: wantOut} {
		if p := pts[name][agent]; p.Count != n || int(anyFloat(p.Sum)) != want {
			t.Errorf("OTLP %s: %d rollouts, sum %v; want %d, %d", name, p.Count, p.Sum, n, want)
		}
	}
}
