package e2e

// Gym's metrics, end to end: the Gym-shaped stack started under ng_run
// (its servers' parent, Gym's orchestrator), answering /verify with seeded,
// varied rewards; gymtrace exports to the OTLP sink's metrics service and
// serves Prometheus; the checks hold the metrics against the stack's ground
// truth.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promScrape parses gymtrace's /metrics with expfmt.
func promScrape(t testing.TB, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp := scrapeGet(t, addr)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("gymtrace's /metrics does not parse: %v", err)
	}
	return fams
}

// promOf returns family name's series of the process pid.
func promOf(fams map[string]*dto.MetricFamily, name string, pid int) []*dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, m := range f.Metric {
		for _, l := range m.Label {
			if l.GetName() == "process_pid" && l.GetValue() == strconv.Itoa(pid) {
				out = append(out, m)
			}
		}
	}
	return out
}

// promHist sums pid's histogram series of name: count and sum.
func promHist(fams map[string]*dto.MetricFamily, name string, pid int) (uint64, float64) {
	var n uint64
	var s float64
	for _, m := range promOf(fams, name, pid) {
		n += m.GetHistogram().GetSampleCount()
		s += m.GetHistogram().GetSampleSum()
	}
	return n, s
}

func promGauge(fams map[string]*dto.MetricFamily, name string, pid int) (float64, bool) {
	ms := promOf(fams, name, pid)
	if len(ms) != 1 {
		return 0, false
	}
	return ms[0].GetGauge().GetValue(), true
}

func promCounter(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil || len(f.Metric) == 0 {
		return 0
	}
	return f.Metric[0].GetCounter().GetValue()
}

// sinkPoint is one data point as test/otlpsink writes it (--metrics-format points).
type sinkPoint struct {
	Export   int            `json:"export"`
	Name     string         `json:"name"`
	Type     string         `json:"type"`
	Count    uint64         `json:"count"`
	Sum      any            `json:"sum"`
	Min      any            `json:"min"`
	Max      any            `json:"max"`
	Value    any            `json:"value"`
	Resource map[string]any `json:"resource"`
}

// sinkLatest reads the sink's metrics: for each (metric, process), the
// point of the newest export request (the SDK sends cumulative totals).
func sinkLatest(t testing.TB, path string) map[string]map[int]sinkPoint {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("reading the sink's metrics: %v", err)
	}
	defer f.Close()
	out := map[string]map[int]sinkPoint{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var p sinkPoint
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("sink metrics line is not JSON: %v", err)
		}
		pid := anyInt(p.Resource["process.pid"])
		if out[p.Name] == nil {
			out[p.Name] = map[int]sinkPoint{}
		}
		if old, ok := out[p.Name][pid]; !ok || p.Export >= old.Export {
			out[p.Name][pid] = p
		}
	}
	return out
}

func anyFloat(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return math.NaN()
}

// verifyTruth sums what the stack's /verify calls answered.
type verifyTruth struct {
	calls, ok, rewarded int
	sum, min, max       float64
}

func truthVerify(recs []truthRec, port int) verifyTruth {
	v := verifyTruth{min: math.Inf(1), max: math.Inf(-1)}
	for _, r := range recs {
		if r.Ev != "in" || r.Route != "/verify" || r.Local.Port != port {
			continue
		}
		v.calls++
		if r.Status < 500 {
			v.ok++
		}
		if r.Reward != nil && r.Status == 200 {
			v.rewarded++
			v.sum += *r.Reward
			v.min, v.max = math.Min(v.min, *r.Reward), math.Max(v.max, *r.Reward)
		}
	}
	return v
}

// truthRuns counts the agent's /run requests and their mean duration as the
// agent itself timed them.
func truthRuns(recs []truthRec, port int) (int, time.Duration) {
	n, total := 0, int64(0)
	for _, r := range recs {
		if r.Ev == "in" && r.Route == "/run" && r.Local.Port == port {
			n++
			total += r.MonoEnd - r.MonoStart
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, time.Duration(total / int64(n))
}

func TestGymMetrics(t *testing.T) {
	needRoot(t)
	needStack(t)
	for _, c := range []struct {
		name string
		pad  string   // --verify-pad KiB: "" none
		gt   []string // more gymtrace flags
	}{
		{"small-bodies", "", nil},
		{"verify-over-64KiB", "80", nil},
		// Metrics count every request, also those of traces not sampled:
		// the servers after the agent see traceparent flags 00 (injected by
		// gymtrace, or by a caller's tracer) and the kernel copies them out
		// all the same.
		{"sample-ratio-0.1", "", []string{"--sample-ratio", "0.1"}},
		// Gym's runtime loop and parser: uvloop writes the big answers its own way.
		{"uvloop-httptools-over-64KiB", "80", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stackArgs []string
			if strings.HasPrefix(c.name, "uvloop") {
				stackArgs = []string{"--loop", "uvloop", "--http", "httptools"}
			}
			runGymMetrics(t, c.pad, stackArgs, c.gt...)
		})
	}
}

func runGymMetrics(t *testing.T, pad string, stackArgs []string, gtArgs ...string) {
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	args := append([]string{"--exec-ng-run", "--rewards", "varied", "--reward-seed", "7", "--verify-fail-rate", "0.1", "--truth", truth},
		stackArgs...)
	if pad != "" {
		args = append(args, "--verify-pad", pad)
	}
	st := startStack(t, t, args...)
	if st.ready.LauncherPID == 0 {
		t.Fatal("the stack's ready line names no launcher pid (ng_run)")
	}
	agent, res := st.server("agent"), st.server("resources")
	sk := startSink(t)
	pids := append(st.pids(), st.ready.LauncherPID)
	gt := startGymtrace(t, gtOpts{pids: pids, groups: "per_rollout", otlp: sk.endpoint(), extra: gtArgs,
		env: []string{"OTEL_METRIC_EXPORT_INTERVAL=500"}})

	// gym.servers.active: ng_run started the three servers.
	orch := st.ready.LauncherPID
	waitFor(t, 10*time.Second, "gym_servers_active of ng_run at 3", func() bool {
		v, ok := promGauge(promScrape(t, gt.metricsAddr), "gym_servers_active", orch)
		return ok && v == 3
	})

	since, began := monoNow(), time.Now() // the warmup's rollouts (untraced) are not counted
	const n, conc = 40, 8
	sum := st.collect(t, n, conc, false)
	if sum.Rollouts != n {
		t.Fatalf("collector ran %d rollouts, want %d", sum.Rollouts, n)
	}
	recs, err := waitTruth(truth, since, n)
	if err != nil {
		t.Fatal(err)
	}
	runs, runMean := truthRuns(recs, agent.Port)
	vt := truthVerify(recs, res.Port)
	if runs != n || vt.calls != n || vt.rewarded == 0 || vt.ok == vt.calls {
		t.Fatalf("the truth has %d /run, %d /verify (%d ok, %d with a reward): want %d each, some failed",
			runs, vt.calls, vt.ok, vt.rewarded, n)
	}

	// Prometheus: the histograms reach the truth's counts.
	var fams map[string]*dto.MetricFamily
	waitFor(t, 20*time.Second, "the rollout and verify histograms to reach the truth's counts", func() bool {
		fams = promScrape(t, gt.metricsAddr)
		r, _ := promHist(fams, "gym_rollout_duration_ms_milliseconds", agent.PID)
		v, _ := promHist(fams, "gym_verify_duration_ms_milliseconds", res.PID)
		return r >= uint64(runs) && v >= uint64(vt.calls)
	})
	rc, rs := promHist(fams, "gym_rollout_duration_ms_milliseconds", agent.PID)
	vc, _ := promHist(fams, "gym_verify_duration_ms_milliseconds", res.PID)
	if rc != uint64(runs) || vc != uint64(vt.calls) {
		t.Errorf("histogram counts: rollout %d (truth %d /run), verify %d (truth %d /verify)", rc, runs, vc, vt.calls)
	}
	t.Logf("rollout mean: gymtrace %.2f ms, the agent's own timing %.2f ms (difference %.2f ms); %d rollouts in %s",
		rs/float64(rc), float64(runMean)/1e6, rs/float64(rc)-float64(runMean)/1e6, runs, time.Since(began).Round(time.Millisecond))
	if v, ok := promGauge(fams, "gym_verify_success_rate_ratio", res.PID); !ok || math.Abs(v-float64(vt.ok)/float64(vt.calls)) > 1e-9 {
		t.Errorf("gym_verify_success_rate_ratio %v (present %v), want %d/%d", v, ok, vt.ok, vt.calls)
	}

	// The reward: found ones are right, missing ones are counted, never a guess.
	wc, ws := promHist(fams, "gym_verify_reward", res.PID)
	missing := promCounter(fams, "gymtrace_gym_reward_missing_total")
	t.Logf("rewards: %d read, %v not found, of %d answered (sum read %v, answered %v)", wc, missing, vt.rewarded, ws, vt.sum)
	if int(wc)+int(missing) != vt.rewarded {
		t.Errorf("rewards read %d + not found %v != %d answered with a reward", wc, missing, vt.rewarded)
	}
	if pad == "" && int(wc) != vt.rewarded {
		t.Errorf("small bodies: %d of %d rewards read, want all", wc, vt.rewarded)
	}
	if int(wc) < vt.rewarded/2 {
		t.Errorf("only %d of %d rewards read", wc, vt.rewarded)
	}
	if int(wc) == vt.rewarded && math.Abs(ws-vt.sum) > 1e-9*math.Max(1, math.Abs(vt.sum)) {
		t.Errorf("reward sum %v, the stack answered %v", ws, vt.sum)
	}

	// HTTP server metrics: every request the resources server answered.
	resIns := 0
	for _, r := range recs {
		if r.Ev == "in" && r.Local.Port == res.Port {
			resIns++
		}
	}
	if hc, _ := promHist(fams, "http_server_duration_milliseconds", res.PID); int(hc) != resIns {
		t.Errorf("http_server_duration count %d at resources, the truth has %d requests", hc, resIns)
	}
	for _, m := range promOf(fams, "http_server_duration_milliseconds", res.PID) {
		for _, l := range m.Label {
			if l.GetName() == "http_target" && strings.Contains(l.GetValue(), "ng-rollout/") && !strings.Contains(l.GetValue(), "{rollout_id}") {
				t.Errorf("a raw rollout id in http_target: %s", l.GetValue())
			}
		}
	}
	if c, _ := promHist(fams, "http_client_duration_milliseconds", agent.PID); c == 0 {
		t.Error("no http_client_duration series for the agent's calls")
	}

	// OTLP: the sink's metrics service received the same counts, per resource.
	sinkOut := strings.TrimSuffix(sk.out, filepath.Ext(sk.out)) + ".metrics.jsonl"
	var pts map[string]map[int]sinkPoint
	waitFor(t, 10*time.Second, "the OTLP sink to receive the rollout and verify counts", func() bool {
		pts = sinkLatest(t, sinkOut)
		return pts["gym.rollout.duration_ms"][agent.PID].Count >= uint64(runs) &&
			pts["gym.verify.duration_ms"][res.PID].Count >= uint64(vt.calls)
	})
	ro, ve := pts["gym.rollout.duration_ms"][agent.PID], pts["gym.verify.duration_ms"][res.PID]
	if ro.Count != uint64(runs) || ve.Count != uint64(vt.calls) {
		t.Errorf("OTLP counts: rollout %d, verify %d; want %d, %d", ro.Count, ve.Count, runs, vt.calls)
	}
	if sn := anyString(ro.Resource["service.name"]); sn != "nemo-gym/"+agent.Name {
		t.Errorf("OTLP rollout histogram's service.name %q, want nemo-gym/%s", sn, agent.Name)
	}
	if rw, ok := pts["gym.verify.reward"][res.PID]; ok {
		if lo, hi := anyFloat(rw.Min), anyFloat(rw.Max); lo < vt.min || hi > vt.max {
			t.Errorf("rewards read span [%v, %v], the stack answered within [%v, %v]: a decoy was taken", lo, hi, vt.min, vt.max)
		}
	} else {
		t.Error("no gym.verify.reward over OTLP")
	}

	// ng_run stops its servers and exits: gym.servers.active reads 0 (the
	// series stays for a while so the last value is seen).
	st.Cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, 20*time.Second, "gym_servers_active of ng_run at 0 after it exited", func() bool {
		v, ok := promGauge(promScrape(t, gt.metricsAddr), "gym_servers_active", orch)
		return ok && v == 0
	})
	gt.shutdown(t)
}

// TestGymMetricsGroupsOff: with rollout and verify off, no gym.rollout or
// gym.verify series exist; with every group off, no HTTP series either.
func TestGymMetricsGroupsOff(t *testing.T) {
	needRoot(t)
	needStack(t)
	st := sharedStack(t)
	for _, c := range []struct {
		groups     string
		wantServer bool
	}{{"server,http_client", true}, {"", false}} {
		t.Run(fmt.Sprintf("groups=%q", c.groups), func(t *testing.T) {
			gt := startGymtrace(t, gtOpts{pids: st.pids(), groups: c.groups, jsonl: filepath.Join(t.TempDir(), "spans.jsonl")})
			st.collect(t, 8, 4, true)
			gt.settle(t, 0)
			fams := promScrape(t, gt.metricsAddr)
			for name := range fams {
				if strings.HasPrefix(name, "gym_rollout") || strings.HasPrefix(name, "gym_verify") {
					t.Errorf("groups %q: series %s", c.groups, name)
				}
				if !c.wantServer && strings.HasPrefix(name, "http_") {
					t.Errorf("groups %q: series %s", c.groups, name)
				}
			}
			if hc, _ := promHist(fams, "http_server_duration_milliseconds", st.server("resources").PID); c.wantServer && hc == 0 {
				t.Errorf("groups %q: no http_server_duration at resources", c.groups)
			}
			gt.shutdown(t)
		})
	}
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
