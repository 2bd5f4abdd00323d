//go:build linux

package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// TwinRow is one row of the twin phase over its rounds: the measured copy
// (traced, or running Gym's telemetry) against its untraced twin of the
// same seconds.
type TwinRow struct {
	Config string `json:"config"`
	Rounds int    `json:"rounds"`
	// Servers' CPU per rollout, measured copy over twin.
	StackCPU Interval `json:"stack_cpu_ratio"`
	// Servers' and gymtrace agent's CPU per rollout over the twin's: the
	// whole CPU tracing costs.
	WithAgent Interval `json:"stack_and_agent_cpu_ratio"`
	// Rollouts per second, measured copy over twin.
	Throughput    Interval `json:"throughput_ratio"`
	AgentCPUPct   float64  `json:"tracer_cpu_pct_of_stack"`
	CPUMsPerRoll  float64  `json:"stack_cpu_ms_per_rollout"`
	TwinCPUMsRoll float64  `json:"twin_stack_cpu_ms_per_rollout"`
	RolloutsPerS  float64  `json:"rollouts_per_s"`
	TwinRolloutsS float64  `json:"twin_rollouts_per_s"`
	GymTelemetry  bool     `json:"gym_telemetry,omitempty"`
	Untraced      bool     `json:"untraced,omitempty"`
	// The asyncio-parent probes' hits per rollout and what their kernel
	// round trips cost at this host's measured price (table 3b), as a
	// share of the twin's CPU per rollout: the part of the servers' added
	// CPU that the probes' traps explain (NaN without the tax phase).
	CopiesPerRoll   float64 `json:"context_copies_per_rollout,omitempty"`
	AtSitesPerRoll  float64 `json:"context_copies_at_sites_per_rollout,omitempty"`
	UVWritesPerRoll float64 `json:"uvloop_writes_per_rollout,omitempty"`
	TrapsPct        float64 `json:"probe_traps_pct_of_twin"`
	// The servers' involuntary switches per rollout, measured copy and
	// twin (twinRun.Preempted).
	PreemptedPerRoll     float64 `json:"servers_preempted_per_rollout"`
	TwinPreemptedPerRoll float64 `json:"twin_servers_preempted_per_rollout"`
}

func (rep *Report) analyseTwin() {
	by := map[string][]twinRun{}
	var order []string
	for _, r := range rep.Raw.Twin {
		if r.Invalid != "" {
			continue
		}
		if by[r.Config] == nil {
			order = append(order, r.Config)
		}
		by[r.Config] = append(by[r.Config], r)
	}
	// The row of twinRows a run's name is (or is the baseline of).
	rowOf := func(name string) (int, twinConfig) {
		base := strings.TrimSuffix(name, baselineSuffix)
		i := slices.IndexFunc(twinRows, func(c twinConfig) bool { return c.Name == base })
		if i < 0 {
			return len(twinRows), twinConfig{}
		}
		return i, twinRows[i]
	}
	// The table's order: twinRows', each row followed by its baseline.
	rank := func(name string) int {
		i, _ := rowOf(name)
		if strings.HasSuffix(name, baselineSuffix) {
			return 2*i + 1
		}
		return 2 * i
	}
	slices.SortStableFunc(order, func(a, b string) int { return rank(a) - rank(b) })
	for _, name := range order {
		runs := by[name]
		_, cfg := rowOf(name)
		cpu, withAgent, thr := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		var agent, ms, twinMs, rps, twinRps, copies, atSites, uvw, pre, twinPre []float64
		for _, r := range runs {
			pre = append(pre, r.Preempted/float64(r.Rollouts))
			twinPre = append(twinPre, r.TwinPreempted/float64(r.TwinRollouts))
			copies = append(copies, r.Copies/float64(r.Rollouts))
			atSites = append(atSites, r.AtSites/float64(r.Rollouts))
			uvw = append(uvw, r.UVWrites/float64(r.Rollouts))
			cpu[r.Plain] = append(cpu[r.Plain], r.cpuRatio())
			thr[r.Plain] = append(thr[r.Plain], r.throughputRatio())
			share := 0.0
			if r.CPUMs > 0 {
				share = r.TracerCPUMs / r.CPUMs
			}
			withAgent[r.Plain] = append(withAgent[r.Plain], r.cpuRatio()*(1+share))
			agent = append(agent, 100*share)
			ms = append(ms, r.CPUMs/float64(r.Rollouts))
			twinMs = append(twinMs, r.TwinCPUMs/float64(r.TwinRollouts))
			rps = append(rps, float64(r.Rollouts)/r.ElapsedS)
			twinRps = append(twinRps, float64(r.TwinRollouts)/r.TwinElapsedS)
		}
		row := TwinRow{Config: name, Rounds: len(runs), StackCPU: balancedRatioCI(cpu), Throughput: balancedRatioCI(thr),
			WithAgent: balancedRatioCI(withAgent), AgentCPUPct: mean(agent), CPUMsPerRoll: mean(ms), TwinCPUMsRoll: mean(twinMs),
			RolloutsPerS: mean(rps), TwinRolloutsS: mean(twinRps), GymTelemetry: cfg.GymTel != "", Untraced: cfg.Untraced,
			CopiesPerRoll: mean(copies), AtSitesPerRoll: mean(atSites), UVWritesPerRoll: mean(uvw), TrapsPct: math.NaN(),
			PreemptedPerRoll: mean(pre), TwinPreemptedPerRoll: mean(twinPre)}
		if entry, ret, ok := rep.probeTrapNs(); ok && row.TwinCPUMsRoll > 0 {
			// A copy seen at its call site is an entry probe, any other a
			// return probe (entry trap and return); a write an entry probe.
			atRet := row.CopiesPerRoll - row.AtSitesPerRoll
			trapMs := (atRet*ret + (row.AtSitesPerRoll+row.UVWritesPerRoll)*entry) / 1e6
			row.TrapsPct = 100 * trapMs / row.TwinCPUMsRoll
		}
		rep.Twin = append(rep.Twin, row)
	}
}

// balancedRatioCI summarises a row's ratios when they come in halves, one
// per plain copy of the stack: the geometric mean of the two halves' own
// geometric means, and a t-interval from the variance within the halves
// (Welch-Satterthwaite degrees of freedom). A systematic difference between
// the copies then cancels from the mean and stays out of the interval. With
// fewer than two ratios in a half it falls back to RatioCI over all.
func balancedRatioCI(byCopy map[string][]float64) Interval {
	var halves [][]float64
	var all []float64
	for _, k := range slices.Sorted(maps.Keys(byCopy)) {
		var logs []float64
		for _, r := range byCopy[k] {
			if r > 0 && !math.IsInf(r, 0) && !math.IsNaN(r) {
				logs = append(logs, math.Log(r))
				all = append(all, r)
			}
		}
		halves = append(halves, logs)
	}
	if len(halves) != 2 || len(halves[0]) < 2 || len(halves[1]) < 2 {
		return RatioCI(all)
	}
	m1, s1 := meanSD(halves[0])
	m2, s2 := meanSD(halves[1])
	n1, n2 := float64(len(halves[0])), float64(len(halves[1]))
	v1, v2 := s1*s1/n1, s2*s2/n2
	m := (m1 + m2) / 2
	se := math.Sqrt(v1+v2) / 2
	df := len(all) - 2
	if v1+v2 > 0 {
		df = int(math.Floor((v1 + v2) * (v1 + v2) / (v1*v1/(n1-1) + v2*v2/(n2-1))))
	}
	h := tQuantile975(max(df, 1)) * se
	return Interval{Mean: math.Exp(m), Lo: math.Exp(m - h), Hi: math.Exp(m + h), N: len(all)}
}

// twinTargets are issue 20's cost targets as the twin phase measures them:
// the servers' added CPU per rollout at `default`, at most 5 % of the
// untraced twin's and at most a tenth of Gym telemetry's lower bound (B).
// The throughput targets are for a CPU-saturated machine: the workload
// phase's (--concurrency 32) judge those.
func (rep *Report) twinTargets() {
	add := func(what, target, measured, v string) {
		rep.Targets = append(rep.Targets, TargetRow{What: what, Target: target, Measured: measured, Verdict: v})
	}
	by := map[string]TwinRow{}
	for _, t := range rep.Twin {
		by[t.Config] = t
	}
	if u, ok := by["untraced, A against B"]; ok && u.StackCPU.Valid() {
		add("twin stacks, "+rep.twinRuntime()+": the method's own error (neither copy traced)", "1 within the interval", fmtIv(u.StackCPU, 3),
			map[bool]string{true: "info", false: "BIASED"}[u.StackCPU.N < 2 || (u.StackCPU.Lo <= 1 && u.StackCPU.Hi >= 1)])
	}
	g, ok := by["default"]
	if !ok || !g.StackCPU.Valid() {
		return
	}
	add("twin stacks, "+rep.twinRuntime()+": servers' added CPU per rollout, default", fmt.Sprintf("<= %+.1f %%", maxAddedCPU*100), pctOver(g.StackCPU),
		verdict(g.StackCPU, 1+maxAddedCPU, false))
	if b, ok := by["Gym telemetry default, no-op"]; ok && b.StackCPU.Valid() && b.StackCPU.Mean > 1 {
		iv := shareOfAdded(g.StackCPU, b.StackCPU)
		add("twin stacks, "+rep.twinRuntime()+": servers' added CPU per rollout at default as a share of Gym telemetry B's", fmt.Sprintf("<= %.2f", maxOfGymNoop),
			fmtIv(iv, 3), verdict(iv, maxOfGymNoop, false))
	}
	// The same share at per_rollout (the issue judges default's; this one
	// is for the table users read).
	p, okP := by["per_rollout"]
	if b, ok := by["Gym telemetry per_rollout, no-op"]; ok && okP && p.StackCPU.Valid() && b.StackCPU.Valid() && b.StackCPU.Mean > 1 {
		add("twin stacks, "+rep.twinRuntime()+": servers' added CPU per rollout at per_rollout as a share of Gym telemetry B's at per_rollout", "info",
			fmtIv(shareOfAdded(p.StackCPU, b.StackCPU), 3), "info")
	}
}

func (rep *Report) twinTable() (table, bool) {
	s := rep.Settings
	t := table{title: fmt.Sprintf("7. Twin stacks (%s, CPython 3.14): two copies of the stack loaded in the same %gs windows at concurrency %d each, "+
		"one traced; %d rounds, the traced copy alternating; ratios measured/twin, geometric mean [95%% CI]",
		rep.twinRuntime(), s.TwinWindowS, s.TwinConcurrency, s.TwinRounds)}
	t.rows = append(t.rows, []string{"config", "servers' CPU/rollout", "servers' added", "agent CPU % of stack", "servers + agent added",
		"throughput", "ms/rollout measured / twin", "rollouts/s measured / twin", "context copies (at call sites) + uvloop writes probed / rollout", "their traps, % of twin's CPU",
		"servers preempted / rollout, measured / twin"})
	for _, r := range rep.Twin {
		agent, total := fmtF(r.AgentCPUPct, 2), pctOver(r.WithAgent)
		if r.GymTelemetry || r.Untraced {
			agent, total = "-", pctOver(r.StackCPU)
			if r.GymTelemetry {
				agent = "in process"
			}
		}
		probes, traps := "-", "-"
		if !r.GymTelemetry && !r.Untraced {
			probes = fmtF(r.CopiesPerRoll, 1) + " (" + fmtF(r.AtSitesPerRoll, 1) + ") + " + fmtF(r.UVWritesPerRoll, 1)
			if !math.IsNaN(r.TrapsPct) {
				traps = fmt.Sprintf("%.1f %%", r.TrapsPct)
			}
		}
		t.rows = append(t.rows, []string{r.Config, fmtIv(r.StackCPU, 3), pctOver(r.StackCPU), agent, total, fmtIv(r.Throughput, 3),
			fmtF(r.CPUMsPerRoll, 2) + " / " + fmtF(r.TwinCPUMsRoll, 2), fmtF(r.RolloutsPerS, 1) + " / " + fmtF(r.TwinRolloutsS, 1), probes, traps,
			fmtF(r.PreemptedPerRoll, 2) + " / " + fmtF(r.TwinPreemptedPerRoll, 2)})
	}
	return t, len(t.rows) > 1
}

// twinRuntime names the runtime of the twin phase: "sid" (uvloop) or "sid
// asyncio".
func (rep *Report) twinRuntime() string {
	if rep.Settings.TwinRuntime == runtimeSidAsyncio {
		return "sid asyncio"
	}
	return "sid"
}

// twinNotes: the runs the analysis left out.
func twinNotes(runs []twinRun) []string {
	var out []string
	for _, r := range runs {
		if r.Invalid != "" {
			out = append(out, fmt.Sprintf("twin %s round %d left out: %s", r.Config, r.Round+1, strings.TrimSpace(r.Invalid)))
		}
	}
	return out
}
