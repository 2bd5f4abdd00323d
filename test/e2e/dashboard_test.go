//go:build linux

package e2e

// The Grafana dashboard (deploy/grafana/gymtrace-dashboard.json), every
// query of it, against a real Prometheus scraping gymtrace during a
// Gym-shaped run whose truth the stack writes down (issue 41).
//
// Each query is evaluated as the dashboard has it (Grafana's $__rate_interval
// and $__range given values) and must give at least one number. Where the
// truth is known (rollouts and their outcomes, tokens, rewards, tool calls,
// the host's memory) the query's cumulative form is evaluated too: the same
// expression with each rate(...[window]) or increase(...[window]) replaced
// by the counter itself, which is what the rate is taken of. That form must
// equal the truth exactly: a rate's value depends on scrape timing, the
// counter it is taken of does not.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

type dashTarget struct {
	Panel, RefID, Expr string
}

// dashboardTargets parses every panel's targets out of the dashboard JSON.
func dashboardTargets(t *testing.T) []dashTarget {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "gymtrace-dashboard.json"))
	if err != nil {
		t.Fatalf("reading the dashboard: %v", err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var out []dashTarget
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q query %s is empty", p.Title, tg.RefID)
			}
			out = append(out, dashTarget{p.Title, tg.RefID, tg.Expr})
		}
	}
	return out
}

// grafanaVars gives Grafana's interval variables values; any other $
// variable left is an error (the check would not be evaluating the query).
func grafanaVars(t *testing.T, expr string, rateWindow, rng time.Duration) string {
	t.Helper()
	e := strings.ReplaceAll(expr, "$__rate_interval", fmt.Sprintf("%ds", int(rateWindow.Seconds())))
	e = strings.ReplaceAll(e, "$__range", fmt.Sprintf("%ds", int(rng.Seconds())))
	if strings.Contains(e, "$") {
		t.Fatalf("query %q uses a variable this check does not give a value", expr)
	}
	return e
}

var rateOf = regexp.MustCompile(`\b(?:rate|irate|increase)\(([^()\[\]]+)\[\$__(?:rate_interval|range)\]\)`)

// cumulative is expr with every rate or increase over a dashboard window
// replaced by the counter it is taken of.
func cumulative(expr string) string { return rateOf.ReplaceAllString(expr, "$1") }

// startupMetricMade reports whether gymtrace's code makes the startup
// histograms the "Server startup by stage" panel reads (issue 41's other
// half): the OTLP names in its non-test sources.
func startupMetricMade(t *testing.T) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(filepath.Join(repoRoot, "internal"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || found {
			return err
		}
		b, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(b), `"gym.server.startup.stage_duration_ms"`) {
			found = true
		}
		return err
	})
	if err != nil {
		t.Fatalf("looking for the startup metrics in gymtrace's sources: %v", err)
	}
	return found
}

// dashTruth is what a query's cumulative form must give: one value per
// series, the series named by the value of label key ("" when the query
// gives one series without it).
type dashTruth struct {
	key  string
	want func(labelValue string) (float64, bool) // false: no such series expected
	n    int                                     // how many series
}

func exact(key string, m map[string]float64) dashTruth {
	return dashTruth{key: key, n: len(m), want: func(v string) (float64, bool) { w, ok := m[v]; return w, ok }}
}

func TestDashboard(t *testing.T) {
	needRoot(t)
	needStack(t)
	bin := needPrometheus(t)
	targets := dashboardTargets(t)

	// The run: rollouts under ng_run, 3 model calls each in every dialect
	// with known token counts, 4 get_weather calls, seeded rewards, and
	// 15 % of /verify calls failing (their rollouts fail).
	const n, conc, turns, batches = 24, 4, 3, 3
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	st := startStack(t, t, "--exec-ng-run", "--rewards", "varied", "--reward-seed", "11", "--verify-fail-rate", "0.15", "--truth", truth)
	agent, res := st.server("agent"), st.server("resources")
	gt := startGymtrace(t, gtOpts{pids: append(st.pids(), st.ready.LauncherPID), groups: "per_rollout",
		jsonl: filepath.Join(t.TempDir(), "spans.jsonl"), extra: []string{"--pressure-interval", "1s"}})
	prom := startPrometheus(t, bin, gt.metricsAddr)
	promStart := time.Now()

	// Three batches, each scraped before the next starts: the rates and
	// quantiles the dashboard draws need a counter that moved between two
	// scrapes (a run shorter than a scrape interval would show none).
	since := monoNow()
	var ids []string
	for b := 1; b <= batches; b++ {
		sum := st.collect(t, n/batches, conc, false, "--turns", strconv.Itoa(turns), "--genai", "--model-route", "mixed")
		ids = append(ids, sum.RolloutIDs...)
		waitFor(t, 60*time.Second, fmt.Sprintf("prometheus to scrape batch %d's rollouts", b), func() bool {
			s, err := prom.query("sum(gym_rollout_completed_total)", time.Now())
			return err == nil && len(s) == 1 && s[0].Value >= float64(b*n/batches)
		})
	}
	recs, err := waitTruth(truth, since, n)
	if err != nil {
		t.Fatal(err)
	}

	// The truth, from what the stack's servers wrote down.
	outcomes := map[string]float64{}
	var rewards []float64
	tools := map[string]float64{}
	for _, r := range recs {
		switch {
		case r.Ev != "in":
		case r.Route == "/run" && r.Local.Port == agent.Port:
			if r.Status >= 200 && r.Status < 300 {
				outcomes["success"]++
			} else {
				outcomes["failure"]++
			}
		case r.Route == "/verify" && r.Local.Port == res.Port && r.Status == 200 && r.Reward != nil:
			rewards = append(rewards, *r.Reward)
		case r.Route == "/get_weather" && r.Local.Port == res.Port:
			tools["get_weather"]++
		}
	}
	if outcomes["success"]+outcomes["failure"] != n || outcomes["failure"] == 0 || outcomes["success"] == 0 || len(rewards) == 0 {
		t.Fatalf("the truth has outcomes %v and %d rewards: want %d rollouts, some failed, some rewarded", outcomes, len(rewards), n)
	}
	if len(ids) != n {
		t.Fatalf("the collector names %d rollout ids, want %d", len(ids), n)
	}
	var wantIn, wantOut float64
	for _, rid := range ids {
		for k := 0; k < turns; k++ {
			_, in, out := genaiExpected(genaiModelName(rid, k))
			wantIn, wantOut = wantIn+float64(in), wantOut+float64(out)
		}
	}
	var rewardSum float64
	for _, r := range rewards {
		rewardSum += r
	}
	hostTotal := memTotalMiB(t)

	// Prometheus has scraped the final values: the counters reach the truth.
	waitFor(t, 60*time.Second, "prometheus to scrape every rollout, reward and tool call", func() bool {
		at := time.Now()
		ok := true
		for expr, want := range map[string]float64{
			"sum(gym_rollout_completed_total)":                  n,
			"sum(gym_verify_reward_count)":                      float64(len(rewards)),
			"sum(gym_tool_call_duration_ms_milliseconds_count)": tools["get_weather"],
			"sum(gym_rollout_input_tokens_count)":               n,
		} {
			s, err := prom.query(expr, at)
			ok = ok && err == nil && len(s) == 1 && s[0].Value >= want
		}
		s, err := prom.query("count(gym_process_cpu_percent)", at)
		return ok && err == nil && len(s) == 1 && s[0].Value >= 4
	})
	at := time.Now()
	rng := at.Sub(promStart) + 10*time.Second

	truths := map[string]dashTruth{
		"Rollouts per second by outcome/A": exact("nemo_gym_rollout_outcome", outcomes),
		"Tokens per rollout/A":             exact("", map[string]float64{"": wantIn / n}),
		"Tokens per rollout/B":             exact("", map[string]float64{"": wantOut / n}),
		"Reward histogram/A": {key: "le", n: 20, want: func(le string) (float64, bool) {
			bound, err := strconv.ParseFloat(le, 64)
			if err != nil {
				return 0, false
			}
			c := 0.0
			for _, r := range rewards {
				if r <= bound {
					c++
				}
			}
			return c, true
		}},
		"Mean reward/A":                   exact("", map[string]float64{"": rewardSum / float64(len(rewards))}),
		"Tool calls per second by tool/A": exact("nemo_gym_tool_name", tools),
		"Process pressure: memory/C":      exact("", map[string]float64{"": hostTotal}),
	}
	seen := map[string]bool{}
	startupMade := startupMetricMade(t)
	for _, tg := range targets {
		name := tg.Panel + "/" + tg.RefID
		t.Run(name, func(t *testing.T) {
			if strings.Contains(tg.Expr, "gym_server_startup") && !startupMade {
				t.Skip("SKIPPED, not checked: gymtrace makes no gym.server.startup.* metric yet (issue 41's startup half); " +
					"this check runs, and must then find a startup, once internal/ makes gym.server.startup.stage_duration_ms")
			}
			if strings.Contains(tg.Expr, "gym_server_startup") {
				// This run's stack starts before gymtrace, which traces it by
				// --pid: no start is seen, so none is measured (docs/startup.md).
				t.Skip("checked in TestStartupSpans/dashboard: these queries against Debian's Prometheus scraping a gymtrace " +
					"that saw a Gym-shaped launch start, each series equal to gymtrace's mean")
			}
			expr := grafanaVars(t, tg.Expr, 2*time.Minute, rng)
			got, err := prom.query(expr, at)
			if err != nil {
				t.Fatal(err)
			}
			real := 0
			for _, s := range got {
				if !math.IsNaN(s.Value) && !math.IsInf(s.Value, 0) {
					real++
				}
			}
			t.Logf("%s = %s", expr, fmtSamples(got))
			if real == 0 {
				t.Fatalf("%s gives no number (%d series)", expr, len(got))
			}
			tr, ok := truths[name]
			if !ok {
				return
			}
			seen[name] = true
			cexpr := grafanaVars(t, cumulative(tg.Expr), 2*time.Minute, rng)
			got, err = prom.query(cexpr, at)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cumulative: %s = %s", cexpr, fmtSamples(got))
			if len(got) != tr.n {
				t.Errorf("%d series, want %d", len(got), tr.n)
			}
			for _, s := range got {
				want, ok := tr.want(s.Labels[tr.key])
				if !ok {
					t.Errorf("a series %v the truth does not have", s.Labels)
					continue
				}
				if math.Abs(s.Value-want) > 1e-9*math.Max(1, math.Abs(want)) {
					t.Errorf("series %v = %v, the truth is %v", s.Labels, s.Value, want)
				}
			}
		})
	}
	for name := range truths {
		if !seen[name] {
			t.Errorf("the dashboard has no query %s that the truth was checked against (renamed or removed?)", name)
		}
	}
	t.Logf("truth: outcomes %v, %d rewards (sum %v), tool calls %v, tokens per rollout %v in / %v out, host memory %v MiB",
		outcomes, len(rewards), rewardSum, tools, wantIn/n, wantOut/n, hostTotal)
	gt.shutdown(t)
}

func fmtSamples(s []promSample) string {
	parts := make([]string, 0, len(s))
	for _, x := range s {
		var ls []string
		for k, v := range x.Labels {
			if k != "__name__" && k != "job" && k != "instance" {
				ls = append(ls, k+"="+v)
			}
		}
		sort.Strings(ls)
		parts = append(parts, fmt.Sprintf("{%s} %g", strings.Join(ls, ","), x.Value))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// memTotalMiB is the host's MemTotal in MiB, as gymtrace reports it.
func memTotalMiB(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
