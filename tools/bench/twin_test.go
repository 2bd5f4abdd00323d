//go:build linux

package main

// The twin bench (twin.go, twin_report.go) and the tax phase's trap prices.

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTwinAnalysis(t *testing.T) {
	run := func(cfg string, round int, cpu, rolls, tracer float64) twinRun {
		// The twin: 1000 ms for 100 rollouts in 5 s, every round.
		return twinRun{Config: cfg, Round: round, Copy: "A", Rollouts: int(rolls), CPUMs: cpu, ElapsedS: 5,
			TwinRollouts: 100, TwinCPUMs: 1000, TwinElapsedS: 5, TracerCPUMs: tracer, Preempted: 3 * rolls, TwinPreempted: 100}
	}
	rep := &Report{Raw: RawRuns{Twin: []twinRun{
		run("untraced, A against B", 0, 990, 100, 0), run("untraced, A against B", 1, 1010, 100, 0),
		run("default", 0, 1030, 100, 20), run("default", 1, 1050, 100, 20),
		run("Gym telemetry default, no-op", 0, 1800, 90, 0), run("Gym telemetry default, no-op", 1, 1800, 90, 0),
		{Config: "per_rollout", Round: 0, Invalid: "a collector finished no rollout"},
	}}}
	rep.analyse()
	by := map[string]TwinRow{}
	for _, r := range rep.Twin {
		by[r.Config] = r
	}
	if _, ok := by["per_rollout"]; ok {
		t.Fatal("a row whose only run is invalid must not be analysed")
	}
	d := by["default"]
	if d.Rounds != 2 || !near(d.StackCPU.Mean, math.Sqrt(1.03*1.05), 1e-9) || !near(d.AgentCPUPct, 100*(20.0/1030+20.0/1050)/2, 1e-9) {
		t.Fatalf("default row = %+v", d)
	}
	if !near(d.PreemptedPerRoll, 3, 1e-9) || !near(d.TwinPreemptedPerRoll, 1, 1e-9) {
		t.Fatalf("preempted per rollout %v / %v, want 3 / 1", d.PreemptedPerRoll, d.TwinPreemptedPerRoll)
	}
	if !(d.WithAgent.Mean > d.StackCPU.Mean) || !near(d.Throughput.Mean, 1, 1e-9) {
		t.Fatalf("with the agent %+v must exceed the servers alone %+v; throughput %+v", d.WithAgent, d.StackCPU, d.Throughput)
	}
	g := by["Gym telemetry default, no-op"]
	if !near(g.StackCPU.Mean, 2, 1e-9) || !near(g.Throughput.Mean, 0.9, 1e-9) || !g.GymTelemetry {
		t.Fatalf("Gym row = %+v", g)
	}
	got := map[string]string{}
	for _, r := range rep.Targets {
		got[r.What] = r.Measured + " " + r.Verdict
	}
	for k, v := range map[string]string{
		"twin stacks, sid: servers' added CPU per rollout, default":                                   pctOver(d.StackCPU) + " ok?",
		"twin stacks, sid: servers' added CPU per rollout at default as a share of Gym telemetry B's": fmtIv(shareOfAdded(d.StackCPU, g.StackCPU), 3) + " ok?",
		"twin stacks, sid: the method's own error (neither copy traced)":                              fmtIv(by["untraced, A against B"].StackCPU, 3) + " info",
	} {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if tb, ok := rep.twinTable(); !ok || len(tb.rows) != 4 {
		t.Fatalf("twin table: %v rows", len(tb.rows))
	}
	// The phase ran but made no row: incomplete, unless it was skipped.
	empty := &Report{}
	if err := empty.complete(map[string]bool{"twin": true}); err == nil {
		t.Fatal("a twin phase without rows must be incomplete")
	}
	empty.Skipped = map[string]string{"twin: default": "no sid root"}
	if err := empty.complete(map[string]bool{"twin": true}); err != nil {
		t.Fatalf("a skipped twin phase is complete: %v", err)
	}
}

func TestBalancedRatioCI(t *testing.T) {
	// Copy A costs 4 % more than B whatever is traced; tracing adds 5 %.
	a := []float64{1.05 * 1.04 * 1.01, 1.05 * 1.04 * 0.99, 1.05 * 1.04 * 1.005}
	b := []float64{1.05 * 1.01, 1.05 * 0.99, 1.05 * 0.995}
	iv := balancedRatioCI(map[string][]float64{"A": a, "B": b})
	if !near(iv.Mean, 1.05*math.Sqrt(1.04), 1e-3) || iv.N != 6 {
		t.Fatalf("balanced mean = %+v, want about %.4f", iv, 1.05*math.Sqrt(1.04))
	}
	pooled := RatioCI(append(slices.Clone(a), b...))
	if !(iv.Hi-iv.Lo < pooled.Hi-pooled.Lo) {
		t.Fatalf("the copies' difference must stay out of the interval: balanced %+v, pooled %+v", iv, pooled)
	}
	if !(iv.Lo < iv.Mean && iv.Mean < iv.Hi) {
		t.Fatalf("interval %+v", iv)
	}
	// One half too small: all ratios together.
	if got, want := balancedRatioCI(map[string][]float64{"A": a, "B": b[:1]}), RatioCI(append(slices.Clone(a), b[0])); got != want {
		t.Fatalf("fallback = %+v, want %+v", got, want)
	}
}

func TestTwinFlags(t *testing.T) {
	o, err := parseFlags([]string{"--gymtrace", "x", "--short"})
	if err != nil || o.twinRounds != 2 || o.twinWindow != 3*time.Second || o.twinConc != 4 || o.twinRuntime != runtimeSid {
		t.Fatalf("short defaults: %+v %v", o, err)
	}
	o, err = parseFlags([]string{"--gymtrace", "x"})
	if err != nil || o.twinRounds != 10 || o.twinWindow != 6*time.Second {
		t.Fatalf("full defaults: %+v %v", o, err)
	}
	for _, bad := range [][]string{{"--twin-runtime", "trixie"}, {"--twin-window", "100ms"}, {"--twin-concurrency", "0"}} {
		if _, err := parseFlags(append([]string{"--gymtrace", "x"}, bad...)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestTwinRowsFor(t *testing.T) {
	names := func(short bool, filter string) string {
		rows, err := twinRowsFor(short, filter)
		if err != nil {
			return "error"
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.Name)
		}
		return strings.Join(out, "|")
	}
	for _, c := range []struct {
		short  bool
		filter string
		want   string
	}{
		{false, "", "untraced, A against B|groups off|default|per_rollout|all|server spans only|default, no Python probes|default, GenAI off|default, return probes|default, every copy probed|default, eager Task births probed|" +
			"Gym telemetry default, no-op|Gym telemetry per_rollout, no-op|Gym telemetry default, OTLP"},
		{true, "", "default"},
		{false, "groups off,per_rollout", "groups off|per_rollout|Gym telemetry per_rollout, no-op"},
		{false, "default", "default|default, no Python probes|default, GenAI off|default, return probes|default, every copy probed|default, eager Task births probed|" +
			"Gym telemetry default, no-op|Gym telemetry default, OTLP"},
		{false, "=default;=default, no Python probes", "default|default, no Python probes"},
		{false, "=default", "default"},
		{false, "=default;=groups off", "groups off|default"},
		{true, "server", "server spans only"},
		{false, "nothing", "error"},
	} {
		if got := names(c.short, c.filter); got != c.want {
			t.Errorf("short=%v %q: %s, want %s", c.short, c.filter, got, c.want)
		}
	}
}

// The tax phase's uprobe modes give this host's trap prices (paired per
// round with the bare call), and the twin rows turn their probe counts into
// the share of the twin's CPU those traps cost.
func TestTrapPrices(t *testing.T) {
	tax := func(mode string, round int, call, getppid float64) taxRun {
		return taxRun{Mode: mode, Round: round, NsPer: map[string]float64{trapKind: call, "getppid": getppid}}
	}
	rep := &Report{Raw: RawRuns{
		Tax: []taxRun{
			tax("untraced", 0, 2, 1000), tax("uprobe", 0, 5002, 1000), tax("uretprobe", 0, 7002, 1000),
			tax("untraced", 1, 3, 1100), tax("uprobe", 1, 5203, 1100), tax("uretprobe", 1, 6803, 1100),
		},
		Twin: []twinRun{
			// 40 copies (30 at call sites) and 10 uvloop writes per rollout;
			// the twin's CPU is 10 ms a rollout.
			{Config: "default", Round: 0, Plain: "A", Rollouts: 100, CPUMs: 1100, ElapsedS: 5, TwinRollouts: 100, TwinCPUMs: 1000, TwinElapsedS: 5, Copies: 4000, AtSites: 3000, UVWrites: 1000},
			{Config: "default", Round: 1, Plain: "B", Rollouts: 100, CPUMs: 1100, ElapsedS: 5, TwinRollouts: 100, TwinCPUMs: 1000, TwinElapsedS: 5, Copies: 4000, AtSites: 3000, UVWrites: 1000},
		},
	}}
	rep.analyse()
	want := map[string]float64{"syscall (getppid, untraced)": 1050, "uprobe hit (emulated instruction, empty program)": 5100,
		"uprobe + return probe (empty program)": 6900}
	if len(rep.Traps) != len(want) {
		t.Fatalf("trap rows %+v", rep.Traps)
	}
	for _, r := range rep.Traps {
		if !near(r.Ns.Mean, want[r.Entry], 1e-9) || r.Ns.N != 2 {
			t.Errorf("%s: %+v, want mean %v over 2 rounds", r.Entry, r.Ns, want[r.Entry])
		}
	}
	if ns, measured := rep.trapNs(); !measured || !near(ns, 5100, 1e-9) {
		t.Errorf("trapNs = %v, %v", ns, measured)
	}
	d := rep.Twin[0]
	// (10 x 6.9 us + (30 + 10) x 5.1 us) of 10 ms = 2.73 %.
	if !near(d.CopiesPerRoll, 40, 1e-9) || !near(d.AtSitesPerRoll, 30, 1e-9) || !near(d.UVWritesPerRoll, 10, 1e-9) ||
		!near(d.TrapsPct, 100*(10*6900+40*5100)/1e7, 1e-9) {
		t.Fatalf("twin row %+v", d)
	}
	// Without the tax phase the share is unknown, not zero.
	rep = &Report{Raw: RawRuns{Twin: rep.Raw.Twin}}
	rep.analyse()
	if !math.IsNaN(rep.Twin[0].TrapsPct) {
		t.Fatalf("traps share without prices: %v", rep.Twin[0].TrapsPct)
	}
	if ns, measured := rep.trapNs(); measured || ns != uprobeTrapNs {
		t.Errorf("trapNs without the tax phase = %v, %v", ns, measured)
	}
}
