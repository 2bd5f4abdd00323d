//go:build linux

// Command gtbench is gymtrace's benchmark harness, run by scripts/bench. It
// measures what tracing costs, interleaving configurations in rounds so slow
// drift of the machine cancels out of the paired ratios:
//
//  1. the Gym-shaped test stack untraced and traced with all groups off,
//     default, per_rollout and all: throughput and /run latency ratios;
//     on Debian sid's 3.14 also with Gym's own in-process telemetry
//     (OTLP http/protobuf, or a no-op exporter) instead of gymtrace;
//  2. per-program eBPF cost from bpf_stats, and eBPF time per request;
//  3. the syscall tax on a process gymtrace does not target, above the floor
//     of an empty program on the same tracepoints;
//  4. the agent's capacity: spans/s per core with no ring-buffer loss, CPU
//     per 1000 spans, peak RSS, driven by wrk against a compiled server;
//  5. the kernel gate against copying every message out (no-gate mode);
//  6. twin stacks: two copies of the stack loaded at once, one traced (or
//     running Gym's telemetry) and one not, so the host's noise cancels
//     from the servers' CPU ratio (twin.go).
//
// It prints one table and writes it as JSON. It never fails on a number:
// it exits non-zero only when it could not measure (the table is incomplete).
//
//	gtbench --gymtrace BIN --server BIN [--otlpsink BIN] [--short] [--json FILE] [--markdown FILE]
//	gtbench loop ITERATIONS      (internal: the untargeted syscall loop)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "loop" {
		if err := runLoop(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "gtbench loop: %v\n", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(os.Args[1:]))
}

type options struct {
	gymtrace, server, sink, root, work string
	jsonOut, mdOut                     string
	conns                              []int
	from                               string
	short                              bool
	phases                             string
	configs                            string
	baseline                           string
	rounds, rollouts, conc, warmup     int
	taxRounds, taxIters                int
	capSeconds, capReps                int
	capConns                           string
	settle                             time.Duration
	perfDir                            string
	twinRounds, twinConc               int
	twinRows, twinRuntime              string
	twinWindow                         time.Duration
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("gtbench", flag.ContinueOnError)
	fs.StringVar(&o.gymtrace, "gymtrace", "", "gymtrace binary to measure (required)")
	fs.StringVar(&o.server, "server", "", "test/bench server binary, for agent capacity")
	fs.StringVar(&o.sink, "otlpsink", "", "test/otlpsink binary: also measure capacity into OTLP")
	fs.StringVar(&o.root, "root", ".", "repository root (for test/stack)")
	fs.StringVar(&o.work, "work", "", "directory for logs and scratch files (default: a new temp dir)")
	fs.StringVar(&o.jsonOut, "json", "", "write the table as JSON here")
	fs.StringVar(&o.mdOut, "markdown", "", "write the table as Markdown here")
	fs.StringVar(&o.from, "from", "", "analyse the raw runs of an earlier --json FILE again instead of measuring")
	fs.BoolVar(&o.short, "short", false, "smoke run of about 2-3 minutes (CI); the default is the full run")
	fs.StringVar(&o.phases, "phases", "workload,tax,capacity,twin", "phases to run (workload includes per-program cost and the gate; twin: two copies of the stack at once, one traced)")
	fs.StringVar(&o.baseline, "baseline", "", "an older gymtrace binary: every traced workload row also runs with it, in the same rounds, as \"<row>, baseline\" (to compare two builds side by side)")
	fs.StringVar(&o.configs, "configs", "", "only the workload rows whose name contains one of these comma-separated words, or, as =NAME, the row NAME itself (separate those by ;), with their untraced rows (default: every row)")
	fs.IntVar(&o.rounds, "rounds", 0, "interleaved rounds of the workload, best even: rounds run in forward-backward pairs (default 2 short, 10 full)")
	fs.IntVar(&o.rollouts, "rollouts", 0, "rollouts per workload run (default 24 short, 200 full)")
	fs.IntVar(&o.conc, "concurrency", 4, "rollouts in flight")
	fs.IntVar(&o.warmup, "warmup", 8, "rollouts before measuring (pooled connections exist before gymtrace attaches)")
	fs.DurationVar(&o.settle, "settle", 3*time.Second, "load on each freshly attached gymtrace before its measured window: the steady state a long-running deployment sees (0: measure from attach)")
	fs.StringVar(&o.perfDir, "perf", os.Getenv("GYMTRACE_BENCH_PERF"), "record the servers with perf (cpu-clock) during every measured window into this directory (env GYMTRACE_BENCH_PERF)")
	fs.IntVar(&o.taxRounds, "tax-rounds", 0, "rounds of the untargeted syscall loop (default 2 short, 8 full)")
	fs.IntVar(&o.taxIters, "tax-iters", 0, "iterations per syscall kind per run (default 200000 short, 2000000 full)")
	fs.IntVar(&o.capSeconds, "capacity-seconds", 0, "seconds of wrk load per capacity run (default 3 short, 10 full)")
	fs.IntVar(&o.capReps, "capacity-reps", 0, "capacity runs per exporter (default 1 short, 2 full)")
	fs.StringVar(&o.capConns, "capacity-rates", "", "offered request rates for the capacity phase, comma-separated; 0 = as fast as wrk goes (default 5000,0 short, 5000,10000,20000,0 full)")
	fs.IntVar(&o.twinRounds, "twin-rounds", 0, "rounds of the twin phase (default 2 short, 10 full)")
	fs.IntVar(&o.twinConc, "twin-concurrency", 4, "rollouts in flight on each copy in the twin phase")
	fs.StringVar(&o.twinRows, "twin-rows", "", "only these twin rows, as --configs names them: comma-separated words a row's name contains, or =NAME (separate those by ;) (default: every row; --short: default)")
	fs.StringVar(&o.twinRuntime, "twin-runtime", runtimeSid, "the twin phase's runtime: sid (CPython 3.14, uvloop) or sid-asyncio (the default loop)")
	fs.DurationVar(&o.twinWindow, "twin-window", 0, "load per twin run, on both copies at once (default 3s short, 6s full)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.gymtrace == "" && o.from == "" {
		return nil, errors.New("--gymtrace BIN is required (scripts/bench builds it)")
	}
	def := func(v *int, short, full int) {
		if *v == 0 {
			*v = full
			if o.short {
				*v = short
			}
		}
	}
	def(&o.rounds, 2, 10)
	def(&o.rollouts, 24, 200)
	def(&o.taxRounds, 2, 8)
	def(&o.taxIters, 200000, 2000000)
	def(&o.capSeconds, 3, 10)
	def(&o.capReps, 1, 2)
	def(&o.twinRounds, 2, 10)
	if o.twinWindow == 0 {
		o.twinWindow = 6 * time.Second
		if o.short {
			o.twinWindow = 3 * time.Second
		}
	}
	if o.twinRuntime != runtimeSid && o.twinRuntime != runtimeSidAsyncio {
		return nil, fmt.Errorf("--twin-runtime %q: want %s or %s", o.twinRuntime, runtimeSid, runtimeSidAsyncio)
	}
	if o.twinConc < 1 || o.twinWindow < time.Second {
		return nil, fmt.Errorf("--twin-concurrency %d, --twin-window %s: want at least 1 and 1s", o.twinConc, o.twinWindow)
	}
	if o.capConns == "" {
		o.capConns = "5000,10000,20000,0"
		if o.short {
			o.capConns = "5000,0"
		}
	}
	for _, s := range strings.Split(o.capConns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--capacity-rates %q: want requests/s >= 0, comma-separated", o.capConns)
		}
		o.conns = append(o.conns, n)
	}
	return o, nil
}

func run(args []string) int {
	o, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if o.from != "" {
		return reanalyse(o)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "gtbench: run as root: gymtrace, bpf_stats and the floor program all need it (sudo scripts/bench)")
		return 2
	}
	phases := map[string]bool{}
	for _, p := range strings.Split(o.phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "workload", "tax", "capacity", "twin":
			phases[p] = true
		case "":
		default:
			fmt.Fprintf(os.Stderr, "gtbench: unknown phase %q (workload, tax, capacity, twin)\n", p)
			return 2
		}
	}
	if phases["capacity"] && o.server == "" {
		fmt.Fprintln(os.Stderr, "gtbench: the capacity phase needs --server (go build -o X ./test/bench)")
		return 2
	}
	for _, bin := range []string{o.gymtrace, o.server, o.sink} {
		if bin != "" {
			if _, err := os.Stat(bin); err != nil {
				fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
				return 2
			}
		}
	}
	if o.work == "" {
		if o.work, err = os.MkdirTemp("", "gtbench-"); err != nil {
			fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
			return 1
		}
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gtbench: finding my own binary: %v\n", err)
		return 1
	}
	root, _ := filepath.Abs(o.root)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rep := &Report{Machine: machine(o), Settings: Settings{
		Rounds: o.rounds, Rollouts: o.rollouts, Concurrency: o.conc, TaxRounds: o.taxRounds, TaxIters: o.taxIters,
		CapSeconds: o.capSeconds, CapReps: o.capReps, CapRates: o.conns, RecordBytes: ringbufRecordBytes(), Phases: o.phases, Configs: o.configs,
		Baseline: o.baseline,
	}}
	if phases["twin"] {
		rep.Settings.TwinRounds, rep.Settings.TwinConcurrency, rep.Settings.TwinWindowS = o.twinRounds, o.twinConc, o.twinWindow.Seconds()
		rep.Settings.TwinRuntime = o.twinRuntime
	}
	if v := rep.Machine.BPFStatsSysctl; v == "1" {
		rep.Notes = append(rep.Notes, "kernel.bpf_stats_enabled was already 1 when the run started: every BPF program on the host paid for two clock reads per run throughout (floor and gymtrace alike)")
	}
	log.Info("gtbench starting", "mode", rep.Machine.Mode, "work", o.work, "phases", o.phases)

	var failures []string
	if phases["workload"] {
		stats, err := enableStats()
		if err != nil {
			fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
			return 1
		}
		rep.Raw.Workload, rep.Skipped, err = runWorkload(ctx, wlOptions{Root: root, Dir: o.work, Gymtrace: o.gymtrace,
			Rounds: o.rounds, Rollouts: o.rollouts, Concurrency: o.conc, Warmup: o.warmup, Idle: idleWindow(o.short), Log: log,
			Settle: o.settle, PerfDir: o.perfDir,
			Configs: o.configs, Baseline: o.baseline, Short: o.short, Sink: o.sink})
		stats.Close()
		rep.Notes = append(rep.Notes, skipNotes(rep.Skipped)...)
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	if phases["tax"] && ctx.Err() == nil {
		// bpf_stats is off here (unless someone else holds it on): it would
		// add two clock reads to every program run being measured.
		rep.Raw.Tax, rep.Settings.FloorHooks, err = runTax(ctx, taxOptions{Self: self, Gymtrace: o.gymtrace, Dir: o.work,
			Rounds: o.taxRounds, Iters: o.taxIters, CPU: strconv.Itoa(runtime.NumCPU() - 1), Log: log})
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	if phases["capacity"] && ctx.Err() == nil {
		exporters := []string{"jsonl"}
		if o.sink != "" {
			exporters = append(exporters, "otlp")
		}
		load, tracer := "0", "1"
		if runtime.NumCPU() < 2 {
			load, tracer = "", ""
			rep.Notes = append(rep.Notes, "one CPU: gymtrace and the load share it in the capacity phase")
		}
		rep.Raw.Capacity, err = runCapacity(ctx, capOptions{Gymtrace: o.gymtrace, Server: o.server, Sink: o.sink, Dir: o.work,
			Seconds: o.capSeconds, Rates: o.conns, Reps: o.capReps, Exporters: exporters, LoadCPUs: load, TracerCPUs: tracer, Log: log})
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	if phases["twin"] && ctx.Err() == nil {
		var skipped map[string]string
		rep.Raw.Twin, skipped, err = runTwin(ctx, twinOptions{Root: root, Dir: o.work, Gymtrace: o.gymtrace, Rounds: o.twinRounds,
			Concurrency: o.twinConc, Warmup: o.warmup, Window: o.twinWindow, Settle: o.settle, Short: o.short, Rows: o.twinRows, PerfDir: o.perfDir, Baseline: o.baseline, Runtime: o.twinRuntime, Sink: o.sink, Log: log})
		for row, why := range skipped {
			if rep.Skipped == nil {
				rep.Skipped = map[string]string{}
			}
			rep.Skipped[row] = why
			rep.Notes = append(rep.Notes, fmt.Sprintf("skipped %s: %s", row, why))
		}
		rep.Notes = append(rep.Notes, twinNotes(rep.Raw.Twin)...)
		if err != nil {
			failures = append(failures, err.Error())
		}
	}
	rep.Machine.LoadAvgEnd = loadAvg()
	rep.analyse()
	for _, w := range rep.Raw.Workload {
		if w.Invalid != "" {
			rep.Notes = append(rep.Notes, fmt.Sprintf("workload %s round %d left out: %s", w.Config, w.Round+1, w.Invalid))
		}
	}
	rep.Print(os.Stdout)

	code := 0
	if err := rep.complete(phases); err != nil {
		failures = append(failures, err.Error())
	}
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, rep); err != nil {
			failures = append(failures, err.Error())
		}
	}
	if o.mdOut != "" {
		f, err := os.Create(o.mdOut)
		if err == nil {
			rep.Markdown(f)
			err = f.Close()
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("writing %s: %v", o.mdOut, err))
		}
	}
	for _, f := range failures {
		fmt.Fprintf(os.Stderr, "gtbench: %s\n", f)
		code = 1
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "gtbench: logs are in %s\n", o.work)
	}
	return code
}

// jsonValue turns v into plain maps, slices and scalars by its json tags,
// with NaN and infinite floats (figures that could not be measured) as null:
// encoding/json refuses them, and one missing figure must not lose the table.
func jsonValue(v reflect.Value) any {
	if m, ok := v.Interface().(json.Marshaler); ok && v.Kind() != reflect.Pointer {
		return m
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return jsonValue(v.Elem())
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
		return f
	case reflect.Struct:
		out := map[string]any{}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fv := v.Field(i)
			if strings.Contains(opts, "omitempty") && fv.IsZero() {
				continue
			}
			out[name] = jsonValue(fv)
		}
		return out
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return []any{}
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = jsonValue(v.Index(i))
		}
		return out
	case reflect.Map:
		out := map[string]any{}
		iter := v.MapRange()
		for iter.Next() {
			out[fmt.Sprint(iter.Key().Interface())] = jsonValue(iter.Value())
		}
		return out
	default:
		return v.Interface()
	}
}

// idleWindow is how long each traced run first watches the idle stack, to
// price a gate hit of a process that is not traced.
func idleWindow(short bool) time.Duration {
	if short {
		return 300 * time.Millisecond
	}
	return time.Second
}

// reanalyse prints (and writes) the table of an earlier run from its raw
// runs, e.g. after the analysis changed.
func reanalyse(o *options) int {
	b, err := os.ReadFile(o.from)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
		return 1
	}
	var old struct {
		Machine  Machine  `json:"machine"`
		Settings Settings `json:"settings"`
		Notes    []string `json:"notes"`
		Raw      RawRuns  `json:"raw"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		fmt.Fprintf(os.Stderr, "gtbench: %s is not a gtbench --json report: %v\n", o.from, err)
		return 1
	}
	rep := &Report{Machine: old.Machine, Settings: old.Settings, Raw: old.Raw}
	for _, n := range old.Notes {
		if !strings.HasPrefix(n, "workload ") && !strings.Contains(n, "GYMTRACE_BENCH_NO_GATE") {
			rep.Notes = append(rep.Notes, n)
		}
	}
	rep.analyse()
	rep.Print(os.Stdout)
	code := 0
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, rep); err != nil {
			fmt.Fprintf(os.Stderr, "gtbench: %v\n", err)
			code = 1
		}
	}
	if o.mdOut != "" {
		f, err := os.Create(o.mdOut)
		if err == nil {
			rep.Markdown(f)
			err = f.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "gtbench: writing %s: %v\n", o.mdOut, err)
			code = 1
		}
	}
	return code
}

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(jsonValue(reflect.ValueOf(rep)), "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func machine(o *options) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Mode: "full", BPFStatsSysctl: bpfStatsSysctl(), LoadAvgStart: loadAvg()}
	if o.short {
		m.Mode = "short"
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if out, err := exec.Command(o.gymtrace, "version").Output(); err == nil {
		m.Gymtrace = strings.TrimSpace(string(out))
	}
	return m
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
