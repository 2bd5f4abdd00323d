//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The twin phase: two copies of the same stack load the machine in the same
// seconds, one traced and one not, and each round's ratio compares the two.
//
// Why: on a shared VM the untraced stack's CPU per rollout moves ±10-15 %
// from one run to the next (the host's other tenants), so runs measured one
// after the other (the workload phase) need hundreds of rounds before a 5 %
// target settles. Two stacks measured at once see the same host. Measured
// here at concurrency 4 (2026-12-03, 10 rounds): the per-round ratio of two
// untraced copies has an SD of 1.4 % at once, 11 % one after the other. At
// concurrency 32 the pairing does not help (SD 6-10 % either way): with both
// CPUs saturated, each copy gets half the machine and its CPU per rollout
// depends on how its event loops batch, which differs between the copies
// from window to window. So the phase runs latency-bound (--twin-concurrency
// 4 by default) and judges the CPU targets; the throughput targets, which are
// about a saturated machine, stay with the workload phase.
//
// The copies are not quite alike (one used 2-3 % more CPU a rollout than the
// other, untraced, in every round), so each row alternates between them
// round by round and the analysis averages the two halves
// (balancedRatioCI). The untraced twin pays gymtrace's untargeted tax (the
// target test on its syscalls, the tax phase). The row "untraced, A against
// B" traces neither copy: its ratio is the method's own error.
//
// Both collectors send rollouts for the same seconds (collector --duration)
// rather than a count: neither stack runs alone at the end of a window.

// twinConfig is a row of the twin phase: gymtrace with Spec on one copy of
// the stack, or (GymTel) the Gym-telemetry stack against a plain copy.
type twinConfig struct {
	Name string
	Spec string // --span-groups; "" groups off
	// GymTel: the measured copy runs Gym's own telemetry with this exporter
	// ("noop", or "otlp" to the bench's sink) and Gym's span groups GymSpec,
	// on a stack of its own.
	GymTel, GymSpec string
	// Untraced: neither copy is traced. Its ratios are the method's own
	// error: they should be 1 within their interval.
	Untraced bool
	// Baseline: the row runs the --baseline binary (rowConfigs' twin rows).
	Baseline bool
	Env      []string // more environment for gymtrace (its cost-experiment hooks)
}

// twinRows are the rows of a full run; --short keeps `default` only.
var twinRows = []twinConfig{
	{Name: "untraced, A against B", Untraced: true},
	{Name: "groups off", Spec: ""},
	{Name: "default", Spec: "default"},
	{Name: "per_rollout", Spec: "per_rollout"},
	{Name: "all", Spec: "all"},
	// SERVER spans only: the HTTP parser without asyncio parents (no
	// Python probes anywhere): what `default` adds on top is theirs.
	{Name: "server spans only", Spec: "server"},
	// `default` with the asyncio-parent probes (the context-copy uretprobe,
	// uvloop's write probe) never attached: what they cost. Not a
	// configuration a user has (client spans lose their parents and
	// traceparent its trace): an attribution row.
	{Name: "default, no Python probes", Spec: "default", Env: []string{"GYMTRACE_PROF_NO_PYPROBES=1"}},
	// `default` without the GenAI walk (--genai=false: model bodies not
	// walked for model names and token counts): what the walk costs.
	{Name: "default, GenAI off", Spec: "default", Env: []string{"GYMTRACE_GENAI=false"}},
	// `default` with the link probe left on PyContext_CopyCurrent's return
	// (two kernel entries a copy): what the call-site probes save.
	{Name: "default, return probes", Spec: "default", Env: []string{"GYMTRACE_PY_SITES=0"}},
	// `default` with a call-site probe on every context copy, not only
	// Task.__init__'s (uvloop on 3.14): what task-only links save.
	{Name: "default, every copy probed", Spec: "default", Env: []string{"GYMTRACE_PY_TASKS=0"}},
	// `default` with the Task probe on Task.__init__'s copy, which eager
	// starts (aiohttp's body writers) reach too: what leaving them
	// unprobed saves.
	{Name: "default, eager Task births probed", Spec: "default", Env: []string{"GYMTRACE_PY_EAGER=0"}},
	// Gym's own telemetry, each preset gymtrace's rows run: B (export
	// free, the lower bound the targets are against) and A (OTLP
	// http/protobuf to a counting sink).
	{Name: "Gym telemetry default, no-op", GymTel: "noop", GymSpec: "default"},
	{Name: "Gym telemetry per_rollout, no-op", GymTel: "noop", GymSpec: "per_rollout"},
	{Name: "Gym telemetry default, OTLP", GymTel: "otlp", GymSpec: "default"},
}

// stack names the copy a row's measured side runs on: "" a plain copy (A
// or B, alternating), or the Gym-telemetry copy of its setup.
func (c twinConfig) stack() string {
	if c.GymTel == "" {
		return ""
	}
	return gymTelName(c.GymTel, c.GymSpec)
}

// twinRun is one row in one round: the measured copy against its twin.
type twinRun struct {
	Config string `json:"config"`
	Round  int    `json:"round"`
	Copy   string `json:"measured_copy"` // "A", "B" or a Gym-telemetry copy (twinConfig.stack)
	// Plain: the plain copy in the pair ("A" or "B"), the measured one
	// or, in a Gym-telemetry row, the twin: the halves balancedRatioCI
	// averages.
	Plain string `json:"plain_copy"`
	// The measured copy (traced, or Gym telemetry) and its untraced twin.
	Rollouts     int     `json:"rollouts"`
	CPUMs        float64 `json:"stack_cpu_ms"`
	ElapsedS     float64 `json:"elapsed_s"`
	TwinRollouts int     `json:"twin_rollouts"`
	TwinCPUMs    float64 `json:"twin_stack_cpu_ms"`
	TwinElapsedS float64 `json:"twin_elapsed_s"`
	TracerCPUMs  float64 `json:"tracer_cpu_ms,omitempty"`
	// The traced copy's asyncio-parent probe hits in the window, from
	// gymtrace's counters: context copies linked, uvloop writes seen.
	Copies   float64 `json:"context_copies,omitempty"`
	AtSites  float64 `json:"context_copies_at_sites,omitempty"` // of Copies, linked by call-site probes (one trap)
	UVWrites float64 `json:"uvloop_writes,omitempty"`
	// The servers' involuntary switches in the window (readPreemptions),
	// measured copy and twin: how often something (gymtrace's agent, the
	// other copy, the tick) took a CPU from a server mid-work.
	Preempted     float64 `json:"servers_preempted"`
	TwinPreempted float64 `json:"twin_servers_preempted"`
	Invalid       string  `json:"invalid,omitempty"`
}

// pyProbeHits reads gymtrace's counters of its two Python probes.
func pyProbeHits(m Metrics) (copies, atSites, uvWrites float64) {
	return m["gymtrace_python_context_total{event=linked}"], m["gymtrace_python_context_total{event=linked_site}"],
		m["gymtrace_python_context_total{event=uv_writes}"]
}

// cpuRatio is the measured copy's CPU per rollout over its twin's.
func (r twinRun) cpuRatio() float64 {
	return (r.CPUMs / float64(r.Rollouts)) / (r.TwinCPUMs / float64(r.TwinRollouts))
}

// throughputRatio is the measured copy's rollouts per second over its twin's.
func (r twinRun) throughputRatio() float64 {
	return (float64(r.Rollouts) / r.ElapsedS) / (float64(r.TwinRollouts) / r.TwinElapsedS)
}

type twinOptions struct {
	Root, Dir, Gymtrace string
	Baseline            string // --baseline: an older gymtrace binary, "" none
	Rounds, Concurrency int
	Warmup              int
	Window, Settle      time.Duration
	Short               bool
	Rows                string // --twin-rows: a filter on row names; "" all
	Runtime             string // runtimeSid (uvloop) or runtimeSidAsyncio
	Sink                string // test/otlpsink binary, for the Gym-telemetry OTLP row; "" none
	// PerfDir: record both copies with perf in every window, as
	// perf-r<round>-<row>-{measured,twin}-n<rollouts>.data
	// (scripts/perf-attrib compares each measured copy with its twin).
	PerfDir string
	Log     *slog.Logger
}

// runTwin runs the twin rows on sid's CPython 3.14 (the runtime that also
// packages Gym's telemetry) with uvloop, or with the default asyncio loop
// (o.Runtime). skipped names rows that cannot run.
func runTwin(ctx context.Context, o twinOptions) (runs []twinRun, skipped map[string]string, err error) {
	rows, err := twinRowsFor(o.Short, o.Rows)
	if err != nil {
		return nil, nil, err
	}
	skipped = map[string]string{}
	if why := skipReasons([]wlConfig{{Name: "twin", Runtime: o.Runtime}}, "")["twin"]; why != "" {
		for _, r := range rows {
			skipped["twin: "+r.Name] = why
		}
		o.Log.Warn("twin phase skipped", "why", why)
		return nil, skipped, nil
	}
	for _, r := range rows {
		if r.GymTel == "" {
			continue
		}
		if why := skipReasons([]wlConfig{{Name: "g", Runtime: o.Runtime, GymTel: r.GymTel, GymSpec: r.GymSpec}}, o.Sink)["g"]; why != "" {
			skipped["twin: "+r.Name] = why
			o.Log.Warn("twin row skipped", "row", r.Name, "why", why)
		}
	}
	rows = slices.DeleteFunc(rows, func(r twinConfig) bool { return skipped["twin: "+r.Name] != "" })
	if o.Baseline != "" {
		// Each gymtrace row's twin with the older binary, in the same rounds.
		var with []twinConfig
		for _, r := range rows {
			with = append(with, r)
			if r.GymTel == "" && !r.Untraced {
				b := r
				b.Name += baselineSuffix
				b.Baseline = true
				with = append(with, b)
			}
		}
		rows = with
	}

	// The copies: A and B, and one per Gym-telemetry setup a row runs.
	names := []string{"A", "B"}
	extra := map[string][]string{}
	var sinkAddr string
	for _, r := range rows {
		k := r.stack()
		if k == "" || extra[k] != nil {
			continue
		}
		names = append(names, k)
		extra[k] = gymTelArgs(r.GymTel, r.GymSpec)
		if r.GymTel == "otlp" {
			if sinkAddr == "" {
				sink, addr, err := startGymTelSink(o.Sink, filepath.Join(workDir(o.Dir, "twin"), "otlpsink.log"))
				if err != nil {
					return nil, skipped, err
				}
				defer sink.stop(5 * time.Second)
				sinkAddr = addr
			}
			extra[k] = append(extra[k], "--gym-telemetry-endpoint", "http://"+sinkAddr)
		}
	}
	copies := map[string]*stack{}
	for _, name := range names {
		dir := workDir(o.Dir, "twin-"+strings.ToLower(name))
		st, err := startStack(ctx, o.Root, dir, o.Warmup, o.Runtime, extra[name])
		if err != nil {
			return nil, skipped, fmt.Errorf("the twin phase's stack %s: %w", name, err)
		}
		defer st.stop()
		// Unrecorded: a stack's first collection after start is slower.
		if _, err := st.collectFor(ctx, dir, time.Second, o.Concurrency); err != nil {
			return nil, skipped, fmt.Errorf("settling run of the twin stack %s: %w", name, err)
		}
		copies[name] = st
		o.Log.Info("twin stack up", "copy", name, "pids", st.pidArg())
	}
	for r := 0; r < o.Rounds; r++ {
		for _, i := range rotation(len(rows), r) {
			if ctx.Err() != nil {
				return runs, skipped, ctx.Err()
			}
			row := rows[i]
			// Each row alternates between the copies round by round
			// (balancedRatioCI averages the halves).
			plain, other := "A", "B"
			if (r+i)%2 == 1 {
				plain, other = "B", "A"
			}
			measured, twin := plain, other
			if k := row.stack(); k != "" {
				measured, twin = k, plain
			}
			run, err := twinOnce(ctx, o, row, r, measured, copies[measured], copies[twin])
			if err != nil {
				return runs, skipped, fmt.Errorf("twin %q, round %d: %w", row.Name, r+1, err)
			}
			run.Plain = plain
			o.Log.Info("twin run", "round", r+1, "config", row.Name, "copy", measured,
				"cpu_ratio", fmt.Sprintf("%.3f", run.cpuRatio()), "throughput_ratio", fmt.Sprintf("%.3f", run.throughputRatio()),
				"invalid", run.Invalid)
			runs = append(runs, run)
		}
	}
	return runs, skipped, nil
}

// twinRowsFor are the rows a run measures: every row, `default` alone in a
// short run, or those --twin-rows names (the words of --configs, matchRow:
// "a,b" a name holds, "=NAME" the name itself, separated by ";").
func twinRowsFor(short bool, filter string) ([]twinConfig, error) {
	if filter == "" && !short {
		return twinRows, nil
	}
	rows := slices.DeleteFunc(slices.Clone(twinRows), func(c twinConfig) bool {
		if filter == "" {
			return c.Name != "default"
		}
		return !slices.ContainsFunc(strings.Split(filter, ";"), func(w string) bool { return matchRow(c.Name, strings.TrimSpace(w)) })
	})
	if len(rows) == 0 {
		return nil, fmt.Errorf("--twin-rows %q matches no twin row", filter)
	}
	return rows, nil
}

// twinOnce measures one row: gymtrace attached to st (or st running Gym's
// telemetry) and twin untraced, both loaded for o.Window at once.
func twinOnce(ctx context.Context, o twinOptions, row twinConfig, round int, copyName string, st, twin *stack) (twinRun, error) {
	run := twinRun{Config: row.Name, Round: round, Copy: copyName}
	dir := workDir(o.Dir, "twin")
	var gt *gymtrace
	if row.GymTel == "" && !row.Untraced {
		var err error
		bin := o.Gymtrace
		if row.Baseline {
			bin = o.Baseline
		}
		gt, err = startGymtrace(ctx, gymtraceOptions{
			Bin:     bin,
			Args:    []string{"--pid", st.pidArg(), "--span-groups", row.Spec, "--exporter", "jsonl", "--output", "/dev/null"},
			Env:     row.Env,
			LogPath: filepath.Join(dir, fmt.Sprintf("gymtrace-r%d-%s.log", round, slug(row.Name))),
		})
		if err != nil {
			return run, err
		}
		defer gt.stop(15 * time.Second)
		if err := settle(ctx, wlOptions{Settle: o.Settle, Concurrency: o.Concurrency}, st, dir); err != nil {
			return run, err
		}
	}
	var k0 kernelSnap
	var m0 Metrics
	var err error
	if gt != nil {
		if k0, err = snapKernel(gt.pid()); err != nil {
			return run, err
		}
		if m0, err = scrapeMetrics(gt.metricsAddr); err != nil {
			return run, err
		}
	}
	a0, b0, err := ofBoth(st, twin, (*stack).cpu)
	if err != nil {
		return run, err
	}
	pa0, pb0, err := ofBoth(st, twin, (*stack).preemptions)
	if err != nil {
		return run, err
	}
	perfName := fmt.Sprintf("r%d-%s", round, slug(row.Name))
	stopPerfA := startPerf(o.PerfDir, st, perfName+"-measured", o.Log)
	stopPerfB := startPerf(o.PerfDir, twin, perfName+"-twin", o.Log)
	var wg sync.WaitGroup
	var sa, sb collectorSummary
	var ea, eb error
	wg.Add(2)
	go func() {
		defer wg.Done()
		sa, ea = st.collectFor(ctx, workDir(o.Dir, "twin-measured"), o.Window, o.Concurrency)
		if ea == nil && st.gymTel {
			// Inside the window: every span's export is paid by the
			// run that made it (as in the workload phase).
			_, ea = st.flushGymTel(ctx)
		}
	}()
	go func() {
		defer wg.Done()
		sb, eb = twin.collectFor(ctx, workDir(o.Dir, "twin-twin"), o.Window, o.Concurrency)
	}()
	wg.Wait()
	stopPerfA()
	stopPerfB()
	if o.PerfDir != "" {
		// The rollouts of each window go into its name: a window's count
		// is the unit perf-attrib divides by.
		for side, n := range map[string]int{"measured": sa.Rollouts, "twin": sb.Rollouts} {
			p := filepath.Join(o.PerfDir, "perf-"+perfName+"-"+side)
			_ = os.Rename(p+".data", fmt.Sprintf("%s-n%d.data", p, n))
		}
	}
	if ea != nil {
		return run, ea
	}
	if eb != nil {
		return run, eb
	}
	a1, b1, err := ofBoth(st, twin, (*stack).cpu)
	if err != nil {
		return run, err
	}
	pa1, pb1, err := ofBoth(st, twin, (*stack).preemptions)
	if err != nil {
		return run, err
	}
	run.Preempted, run.TwinPreempted = counted(pa0, pa1), counted(pb0, pb1)
	run.Rollouts, run.ElapsedS, run.CPUMs = sa.Rollouts, sa.ElapsedS, float64(a1-a0)/1e6
	run.TwinRollouts, run.TwinElapsedS, run.TwinCPUMs = sb.Rollouts, sb.ElapsedS, float64(b1-b0)/1e6
	switch {
	case sa.Rollouts == 0 || sb.Rollouts == 0 || sa.ElapsedS <= 0 || sb.ElapsedS <= 0:
		run.Invalid = "a collector finished no rollout"
	case sa.OK != sa.Rollouts || sb.OK != sb.Rollouts:
		run.Invalid = fmt.Sprintf("rollouts failed: %d of %d measured, %d of %d twin: %v %v",
			sa.Rollouts-sa.OK, sa.Rollouts, sb.Rollouts-sb.OK, sb.Rollouts, sa.Errors, sb.Errors)
	}
	if gt != nil {
		k1, err := snapKernel(gt.pid())
		if err != nil {
			return run, err
		}
		run.TracerCPUMs = float64(k1.Usage.CPU-k0.Usage.CPU) / 1e6
		m1, err := scrapeMetrics(gt.metricsAddr)
		if err != nil {
			return run, err
		}
		c0, s0, u0 := pyProbeHits(m0)
		c1, s1, u1 := pyProbeHits(m1)
		run.Copies, run.AtSites, run.UVWrites = c1-c0, s1-s0, u1-u0
		if err := gt.stop(15 * time.Second); err != nil {
			return run, fmt.Errorf("stopping gymtrace: %w", err)
		}
	}
	return run, nil
}

// ofBoth reads the same figure of both copies, one right after the other.
func ofBoth[T any](a, b *stack, read func(*stack) (T, error)) (T, T, error) {
	va, err := read(a)
	if err != nil {
		var zero T
		return zero, zero, err
	}
	vb, err := read(b)
	return va, vb, err
}

// counted is a counter's growth from a to b; a thread that ended in between
// took its count along, so a sum that fell counts as none.
func counted(a, b uint64) float64 {
	if b < a {
		return 0
	}
	return float64(b - a)
}
