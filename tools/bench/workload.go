//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// wlRun is one run of the workload under one configuration.
type wlRun struct {
	Config        string      `json:"config"`
	Round         int         `json:"round"`
	Rollouts      int         `json:"rollouts"`
	OK            int         `json:"ok"`
	ElapsedS      float64     `json:"elapsed_s"`
	RolloutsPerS  float64     `json:"rollouts_per_s"`
	P50Ms         float64     `json:"p50_ms"`
	P99Ms         float64     `json:"p99_ms"`
	Requests      int         `json:"requests"` // HTTP requests the three servers served
	StackCPUMs    float64     `json:"stack_cpu_ms"`
	Progs         []progDelta `json:"programs,omitempty"`
	TargetHits    uint64      `json:"target_syscall_hits"` // the servers' syscalls on gymtrace's hooks
	RingBytes     uint64      `json:"ring_bytes,omitempty"`
	Records       float64     `json:"records,omitempty"` // ring-buffer records the agent read
	GateFlags     uint32      `json:"gate_flags,omitempty"`
	TracerCPUMs   float64     `json:"tracer_cpu_ms,omitempty"`
	TracerHWMB    uint64      `json:"tracer_peak_rss_bytes,omitempty"`
	SpansBuilt    float64     `json:"spans_built,omitempty"`
	RingbufFailed float64     `json:"ringbuf_reserve_failures,omitempty"`
	// Gym-telemetry rows: spans the batch queue dropped (SpansBuilt are
	// the spans Gym's telemetry exported).
	GymSpansDropped float64 `json:"gym_spans_dropped,omitempty"`
	Invalid         string  `json:"invalid,omitempty"`
}

// wlOptions size the workload phase.
type wlOptions struct {
	Root, Dir, Gymtrace string
	Baseline            string // --baseline: an older gymtrace binary, "" none
	Rounds, Rollouts    int
	Concurrency, Warmup int
	Idle                time.Duration // idle window before each traced run
	// Settle: load before each traced run's measured window, so that it
	// measures gymtrace settled (a process that only serves has its
	// Python probes off a second after its first answers, internal/agent).
	Settle time.Duration
	// PerfDir: record the servers' CPU (perf, cpu-clock) during every
	// measured window into this directory (GYMTRACE_BENCH_PERF).
	PerfDir string
	Log     *slog.Logger
	Configs string // --configs: a filter on row names; "" all
	Short   bool   // --short: no full-only rows
	Sink    string // test/otlpsink binary, for the Gym-telemetry OTLP rows; "" none
}

// runWorkload runs every configuration Rounds times, interleaved. Each
// stack (one per runtime and Gym telemetry setup) is started once and kept
// warm. skipped names the rows that cannot run here, with why.
func runWorkload(ctx context.Context, o wlOptions) (runs []wlRun, skipped map[string]string, err error) {
	type rt struct {
		st   *stack
		slot int
	}
	rts := map[string]*rt{}
	configs := workloadRows(o.Baseline != "", o.Configs, o.Short)
	skipped = skipReasons(configs, o.Sink)
	byWhy := map[string][]string{}
	var whys []string
	for _, c := range configs {
		if w := skipped[c.Name]; w != "" {
			if byWhy[w] == nil {
				whys = append(whys, w)
			}
			byWhy[w] = append(byWhy[w], c.Name)
		}
	}
	for _, w := range whys {
		o.Log.Warn("workload rows skipped", "rows", strings.Join(byWhy[w], "; "), "why", w)
	}
	configs = slices.DeleteFunc(slices.Clone(configs), func(c wlConfig) bool { return skipped[c.Name] != "" })

	var keys []string
	extra := map[string][]string{}
	needSink := false
	for _, c := range configs {
		k := c.stackKey()
		if _, ok := extra[k]; ok {
			continue
		}
		keys = append(keys, k)
		extra[k] = nil
		if c.GymTel != "" {
			extra[k] = gymTelArgs(c.GymTel, c.GymSpec)
			needSink = needSink || c.GymTel == "otlp"
		}
	}
	if needSink {
		// One sink for every OTLP row.
		sink, httpAddr, err := startGymTelSink(o.Sink, filepath.Join(workDir(o.Dir, "workload"), "otlpsink.log"))
		if err != nil {
			return nil, skipped, err
		}
		defer sink.stop(5 * time.Second)
		for k, e := range extra {
			if slices.Contains(e, "otlp") {
				extra[k] = append(e, "--gym-telemetry-endpoint", "http://"+httpAddr)
			}
		}
		o.Log.Info("OTLP sink up for the Gym-telemetry rows", "http", httpAddr)
	}
	hc, err := newHitCounter(append(append([]string(nil), gymtraceHooks...), injectHooks...), max(len(keys), 1))
	if err != nil {
		return nil, skipped, err
	}
	defer hc.Close()
	for i, k := range keys {
		runtime := k
		if r, _, found := strings.Cut(k, "/"); found {
			runtime = r
		}
		st, err := startStack(ctx, o.Root, workDir(o.Dir, "workload-"+slug(k)), o.Warmup, runtime, extra[k])
		if err != nil {
			return nil, skipped, fmt.Errorf("the %q stack: %w", k, err)
		}
		defer st.stop()
		o.Log.Info("test stack up", "stack", k, "pids", st.pidArg())
		if err := hc.Watch(i, []int{st.pids["agent"], st.pids["model"], st.pids["resources"]}); err != nil {
			return nil, skipped, err
		}
		// One unrecorded run first: the servers' first collection after
		// start is slower (lazy imports, first connections), and it must
		// not land in a measured round.
		if _, _, err := st.collect(ctx, workDir(o.Dir, "workload"), o.Rollouts, o.Concurrency); err != nil {
			return nil, skipped, fmt.Errorf("settling run of the %q stack: %w", k, err)
		}
		rts[k] = &rt{st, i}
	}

	for r := 0; r < o.Rounds; r++ {
		for _, i := range rotation(len(configs), r) {
			cfg := configs[i]
			if ctx.Err() != nil {
				return runs, skipped, ctx.Err()
			}
			x := rts[cfg.stackKey()]
			run, err := runOnce(ctx, o, x.st, hc, x.slot, cfg, r)
			if err != nil {
				return runs, skipped, fmt.Errorf("workload %q, round %d: %w", cfg.Name, r+1, err)
			}
			o.Log.Info("workload run", "round", r+1, "config", cfg.Name, "rollouts_per_s", run.RolloutsPerS,
				"p50_ms", fmt.Sprintf("%.1f", run.P50Ms), "requests", run.Requests, "invalid", run.Invalid)
			runs = append(runs, run)
		}
	}
	return runs, skipped, nil
}

func runOnce(ctx context.Context, o wlOptions, st *stack, hc *hitCounter, slot int, cfg wlConfig, round int) (wlRun, error) {
	run := wlRun{Config: cfg.Name, Round: round}
	dir := workDir(o.Dir, "workload")
	var gt *gymtrace
	if cfg.Traced {
		var err error
		bin := o.Gymtrace
		if cfg.Baseline {
			bin = o.Baseline
		}
		gt, err = startGymtrace(ctx, gymtraceOptions{
			Bin: bin,
			Args: append([]string{"--pid", st.pidArg(), "--span-groups", cfg.Spec,
				"--exporter", "jsonl", "--output", "/dev/null"}, cfg.Args...),
			NoGate:  cfg.NoGate,
			LogPath: filepath.Join(dir, fmt.Sprintf("gymtrace-r%d-%s.log", round, slug(cfg.Name))),
		})
		if err != nil {
			return run, err
		}
		defer gt.stop(15 * time.Second)
	}
	var kIdle kernelSnap
	var hIdle map[string]uint64
	var err error
	if gt != nil {
		if kIdle, err = snapKernel(gt.pid()); err != nil {
			return run, err
		}
		if hIdle, err = hc.Read(slot); err != nil {
			return run, err
		}
		time.Sleep(o.Idle)
		if err := settle(ctx, o, st, dir); err != nil {
			return run, err
		}
	}
	var tel0 gymTelCounts
	if st.gymTel {
		// Nothing is pending here (the last run ended with a flush): this
		// only reads the counts.
		if tel0, err = st.flushGymTel(ctx); err != nil {
			return run, err
		}
	}
	st.countRequests() // discard anything before this run
	cpu0, err := st.cpu()
	if err != nil {
		return run, err
	}
	h0, err := hc.Read(slot)
	if err != nil {
		return run, err
	}
	var k0 kernelSnap
	var m0 Metrics
	if gt != nil {
		if k0, err = snapKernel(gt.pid()); err != nil {
			return run, err
		}
		if m0, err = scrapeMetrics(gt.metricsAddr); err != nil {
			return run, err
		}
	}

	stopPerf := startPerf(o.PerfDir, st, fmt.Sprintf("r%d-%s", round, slug(cfg.Name)), o.Log)
	sum, lat, err := st.collect(ctx, dir, o.Rollouts, o.Concurrency)
	stopPerf()
	if err != nil {
		return run, err
	}
	var tel1 gymTelCounts
	if st.gymTel {
		// Gym's batch processor exports every 512 spans and every 5 s: the
		// rest of this run's spans are exported now, inside the measured
		// window, so that every span's export is paid by the run that made
		// it. (The metric reader keeps its own 10 s period.)
		if tel1, err = st.flushGymTel(ctx); err != nil {
			return run, err
		}
	}
	// The servers flush their truth records every 200 ms.
	time.Sleep(300 * time.Millisecond)
	cpu1, err := st.cpu()
	if err != nil {
		return run, err
	}
	run.Requests = st.countRequests()
	h1, err := hc.Read(slot)
	if err != nil {
		return run, err
	}
	for _, h := range gymtraceHooks {
		run.TargetHits += h1[h] - h0[h]
	}
	run.Rollouts, run.OK, run.ElapsedS, run.RolloutsPerS = sum.Rollouts, sum.OK, sum.ElapsedS, sum.RolloutsPerS
	run.StackCPUMs = float64(cpu1-cpu0) / 1e6
	run.P50Ms = Percentile(lat, 50) * 1000
	run.P99Ms = Percentile(lat, 99) * 1000
	if sum.OK != sum.Rollouts {
		run.Invalid = fmt.Sprintf("%d of %d rollouts failed: %v", sum.Rollouts-sum.OK, sum.Rollouts, sum.Errors)
	}
	if st.gymTel {
		run.SpansBuilt = tel1.SpansExported - tel0.SpansExported
		run.GymSpansDropped = tel1.SpansDropped - tel0.SpansDropped
		switch {
		case tel1.SpansFailed > tel0.SpansFailed || tel1.MetricExportsFailed > tel0.MetricExportsFailed:
			run.Invalid = fmt.Sprintf("Gym telemetry exports failed (%v spans, %v metric exports): the sink did not take them",
				tel1.SpansFailed-tel0.SpansFailed, tel1.MetricExportsFailed-tel0.MetricExportsFailed)
		case !tel1.Flushed:
			run.Invalid = "Gym telemetry's span processor did not flush within 10 s"
		}
	}
	if gt == nil {
		return run, nil
	}
	k1, err := snapKernel(gt.pid())
	if err != nil {
		return run, err
	}
	m1, err := scrapeMetrics(gt.metricsAddr)
	if err != nil {
		return run, err
	}
	run.Progs = progDeltas(kIdle, k0, k1, hIdle, h0, h1)
	run.RingBytes = k1.RingPos - k0.RingPos
	run.GateFlags = k1.GateFlags
	run.TracerCPUMs = float64(k1.Usage.CPU-k0.Usage.CPU) / 1e6
	run.TracerHWMB = k1.Usage.HWMBytes
	run.SpansBuilt = m1.Sum("gymtrace_spans_built_total") - m0.Sum("gymtrace_spans_built_total")
	run.RingbufFailed = m1.Sum("gymtrace_ringbuf_reserve_failures_total") - m0.Sum("gymtrace_ringbuf_reserve_failures_total")
	run.Records = m1.Sum("gymtrace_ringbuf_records_read_total") - m0.Sum("gymtrace_ringbuf_records_read_total")
	if err := gt.stop(15 * time.Second); err != nil {
		return run, fmt.Errorf("stopping gymtrace: %w", err)
	}
	return run, nil
}

func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}

// startGymTelSink starts the OTLP sink the Gym-telemetry OTLP rows export
// to, counting only (as a collector's receiver): its CPU is not the
// stack's, as gymtrace's is not. It returns the sink's http/protobuf
// address.
func startGymTelSink(bin, logPath string) (*child, string, error) {
	sink, addrs, err := startListeningN("otlpsink", []string{bin, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--count-only"}, logPath, 2)
	if err != nil {
		return nil, "", fmt.Errorf("starting the OTLP sink for the Gym-telemetry rows: %w", err)
	}
	httpAddr, ok := strings.CutPrefix(addrs[1], "listening-http ")
	if !ok {
		sink.stop(5 * time.Second)
		return nil, "", fmt.Errorf("the OTLP sink printed %q, not \"listening-http HOST:PORT\" (a sink without --http-listen?)", addrs[1])
	}
	return sink, httpAddr, nil
}
