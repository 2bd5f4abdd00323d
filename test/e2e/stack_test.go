//go:build linux

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --- tests ------------------------------------------------------------------------

// TestSelections traces the running stack under each span-group selection of
// the spec and checks the spans against Gym's, and the kernel's per-group
// counters against the gate: a disabled group gets no span and no ring-buffer
// record (emitted stays 0; requests of it are counted as discarded).
func TestSelections(t *testing.T) {
	st := sharedStack(t)
	cases := []struct {
		name, spec string
		enabled    groupSet
	}{
		{"default", "default", newGroupSet("job", "server", "http_client", "rollout")},
		{"per_rollout", "per_rollout", newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")},
		{"server_http_client_verify", "server,http_client,verify", newGroupSet("server", "http_client", "verify")},
		{"verify_alone", "verify", newGroupSet("verify")},
		{"everything_off", "", newGroupSet()},
	}
	const n = 3
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := traceStack(t, st, c.spec, c.enabled, n)
			r.checkCounters(t)
			r.checkSpans(t)
			if len(c.enabled) == 0 {
				if len(r.spans.all) != 0 {
					t.Errorf("everything off exported %d spans", len(r.spans.all))
				}
				// The gate returns before reading any user memory.
				if v := r.metrics[`gymtrace_kernel_events_total{reason="skipped_bytes"}`]; v != 0 {
					t.Errorf("everything off: the kernel looked at %v bytes, want 0", v)
				}
			}
			t.Logf("%s: %d spans, emitted %v, discarded %v", c.spec, len(r.spans.all),
				groupCounters(r.metrics, "gymtrace_events_emitted_total"), groupCounters(r.metrics, "gymtrace_events_discarded_total"))
		})
	}
}

// TestAttachToRunningStack_PreexistingKeepAlive is the normal flow made
// explicit: the agent's pooled keep-alive connections to the model and
// resources servers (and to itself) were opened by the warmup, before gymtrace
// started, so no accept or connect is ever seen for them; the next rollouts
// on those very connections must still produce complete, joined traces.
func TestAttachToRunningStack_PreexistingKeepAlive(t *testing.T) {
	st := sharedStack(t)
	// Untraced rollouts first: uvicorn closes connections idle for 30 s, so
	// make sure the agent's pool is fresh, and opened before gymtrace.
	st.collect(t, 2, 2, true)
	agent := st.server("agent").PID
	before := establishedLocalPorts(t, agent)
	if len(before) == 0 {
		t.Fatalf("the agent (pid %d) has no established TCP connection after the warmup", agent)
	}
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 3)
	r.checkCounters(t)
	r.checkSpans(t)
	reused := 0
	for _, s := range r.spans.all {
		if s.Kind == "CLIENT" && before[s.AttrInt("network.local.port")] {
			reused++
			if _, ok := r.spans.byID[s.Parent]; !ok {
				t.Errorf("call on a pre-existing connection has no parent: %v", s)
			}
		}
	}
	if reused == 0 {
		t.Errorf("no CLIENT span on any of the agent's %d pre-existing connections (local ports %v): the test did not exercise attach-to-running",
			len(before), before)
	}
	t.Logf("%d of the agent's calls ran on connections opened before gymtrace attached", reused)
}

// TestStackIPv6 runs the stack on ::1: 4-tuples, addresses and url.full in
// IPv6 form.
func TestStackIPv6(t *testing.T) {
	needStack(t)
	st := startStack(t, t, "--host", "::1")
	r := traceStack(t, st, "default", newGroupSet("job", "server", "http_client", "rollout"), 2)
	r.checkCounters(t)
	r.checkSpans(t)
	for _, s := range r.spans.all {
		if s.Kind == "CLIENT" && !strings.HasPrefix(s.Attr("url.full"), "http://[::1]:") {
			t.Errorf("IPv6 url.full %q", s.Attr("url.full"))
		}
	}
}

// TestStreamingSSE: the model answers "stream": true with text/event-stream
// in chunked encoding (5 events 2 ms apart); the response ends at its last
// chunk, so model spans last at least the stream and the rest of the rollout
// still joins.
func TestStreamingSSE(t *testing.T) {
	st := sharedStack(t)
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 2, "--stream")
	r.checkCounters(t)
	r.checkSpans(t)
	model := st.server("model").PID
	n := 0
	for _, s := range r.spans.all {
		if s.PID() == model && s.Kind == "SERVER" {
			n++
			if s.Duration() < 10*time.Millisecond {
				t.Errorf("streamed model response took %v, want >= 10 ms (5 events 2 ms apart + latency): %v", s.Duration(), s)
			}
		}
	}
	if n == 0 {
		t.Error("no model SERVER span")
	}
}

// TestServerErrors: every 2nd rollout's first model call answers 500, so its
// model /v1/responses, agent /v1/responses and /run answer 500. A 5xx SERVER
// span is ERROR; a CLIENT span that got a 5xx answer is not.
func TestServerErrors(t *testing.T) {
	st := sharedStack(t)
	sk := startSink(t)
	gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: "per_rollout", otlp: sk.endpoint()})
	sum := st.collect(t, 4, 1, false, "--fail-every", "2")
	if sum.Failed == 0 {
		t.Fatalf("--fail-every 2 failed no rollout: %+v", sum)
	}
	gt.settle(t, 1)
	gt.shutdown(t)
	spans := newSpanSet(readSpans(t, sk.out))
	t.Cleanup(func() {
		if t.Failed() {
			spans.dump(t)
		}
	})
	var s500, c500 int
	for _, s := range spans.all {
		code := s.AttrInt("http.response.status_code")
		switch {
		case s.Kind == "SERVER" && code >= 500:
			s500++
			if s.Status.Code != "ERROR" {
				t.Errorf("5xx SERVER span must be ERROR: %v", s)
			}
		case s.Kind == "SERVER" && s.Status.Code == "ERROR":
			t.Errorf("non-5xx SERVER span is ERROR: %v", s)
		case s.Kind == "CLIENT" && code >= 500:
			c500++
			if s.Status.Code == "ERROR" {
				t.Errorf("a CLIENT span is not ERROR for a 5xx answer: %v", s)
			}
		}
	}
	// Per failed rollout: model, agent /v1/responses and /run answer 500.
	if s500 < 3*sum.Failed || c500 < 2*sum.Failed {
		t.Errorf("%d 5xx SERVER spans and %d 5xx CLIENT spans for %d failed rollouts, want >= %d and >= %d",
			s500, c500, sum.Failed, 3*sum.Failed, 2*sum.Failed)
	}
}

// TestRolloutPrefix: with /ng-rollout/<id>/ on every call, the agent's span is
// named by its route template, model and resources spans by the stripped
// route, the kernel's route table still finds the gym.* groups, and every
// span of a rollout's trace carries that rollout's nemo.gym.rollout.id.
func TestRolloutPrefix(t *testing.T) {
	st := sharedStack(t)
	enabled := newGroupSet("server", "http_client", "rollout", "agent", "model_call", "verify")
	r := traceStack(t, st, "per_rollout", enabled, 3, "--prefix", "all")
	r.checkCounters(t)
	r.checkSpans(t)
	idOfTrace := map[string]string{}
	prefixed := 0
	for _, s := range r.spans.all {
		if _, id := stripRolloutPrefix(s.Path()); id != "" {
			prefixed++
		}
		id := s.Attr("nemo.gym.rollout.id")
		if id == "" {
			continue
		}
		if prev, ok := idOfTrace[s.TraceID]; ok && prev != id {
			t.Errorf("trace %s mixes rollouts %s and %s: %v", s.TraceID, prev, id, s)
		}
		idOfTrace[s.TraceID] = id
	}
	if prefixed == 0 {
		t.Fatal("no span carries a /ng-rollout/<id> path: --prefix all had no effect")
	}
	var ids []string
	for _, id := range idOfTrace {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	want := append([]string{}, r.summary.RolloutIDs...)
	sort.Strings(want)
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		t.Errorf("rollout ids over traces %v, want one trace per rollout %v", ids, want)
	}
}

// establishedLocalPorts lists the local ports of pid's established TCP
// sockets, from /proc/PID/fd and /proc/PID/net/tcp{,6}.
func establishedLocalPorts(t *testing.T, pid int) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	out := map[int]bool{}
	for _, f := range []string{"tcp", "tcp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "01" || !inodes[fs[9]] {
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			if p, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil {
				out[int(p)] = true
			}
		}
		fh.Close()
	}
	return out
}
