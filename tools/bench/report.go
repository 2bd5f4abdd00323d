//go:build linux

package main

import (
	"fmt"
	"slices"
	"strings"
)

// Report is the whole benchmark: what scripts/bench prints and writes as JSON.
type Report struct {
	Machine  Machine       `json:"machine"`
	Settings Settings      `json:"settings"`
	Workload []WorkloadRow `json:"workload"`
	Programs []ProgramRow  `json:"programs"`
	Tax      []TaxRow      `json:"untargeted_tax"`
	Traps    []TrapRow     `json:"kernel_entries,omitempty"`
	Capacity []CapacityRow `json:"agent_capacity"`
	Gate     []GateRow     `json:"gate"`
	Twin     []TwinRow     `json:"twin,omitempty"`
	Targets  []TargetRow   `json:"targets"`
	Notes    []string      `json:"notes,omitempty"`
	// Skipped: workload rows that could not run here, and why.
	Skipped map[string]string `json:"skipped_rows,omitempty"`
	Raw     RawRuns           `json:"raw"`
}

type Machine struct {
	Kernel         string  `json:"kernel"`
	CPUs           int     `json:"cpus"`
	GoVersion      string  `json:"go"`
	Date           string  `json:"date"`
	Mode           string  `json:"mode"`
	BPFStatsSysctl string  `json:"bpf_stats_enabled_before"`
	LoadAvgStart   float64 `json:"loadavg_1m_start"`
	LoadAvgEnd     float64 `json:"loadavg_1m_end"`
	Gymtrace       string  `json:"gymtrace_version"`
}

type Settings struct {
	Rounds          int      `json:"rounds"`
	Rollouts        int      `json:"rollouts"`
	Concurrency     int      `json:"concurrency"`
	TaxRounds       int      `json:"tax_rounds"`
	TaxIters        int      `json:"tax_iterations"`
	CapSeconds      int      `json:"capacity_seconds"`
	CapReps         int      `json:"capacity_reps"`
	CapRates        []int    `json:"capacity_offered_rates"`
	RecordBytes     uint64   `json:"ringbuf_record_bytes"`
	Phases          string   `json:"phases"`
	Configs         string   `json:"configs,omitempty"`  // --configs filter`
	Baseline        string   `json:"baseline,omitempty"` // --baseline binary: each traced row has a twin run with it
	FloorHooks      []string `json:"floor_hooks,omitempty"`
	TwinRounds      int      `json:"twin_rounds,omitempty"`
	TwinConcurrency int      `json:"twin_concurrency,omitempty"`
	TwinRuntime     string   `json:"twin_runtime,omitempty"`
	TwinWindowS     float64  `json:"twin_window_s,omitempty"`
}

type RawRuns struct {
	Workload []wlRun   `json:"workload,omitempty"`
	Tax      []taxRun  `json:"tax,omitempty"`
	Capacity []capRun  `json:"capacity,omitempty"`
	Twin     []twinRun `json:"twin,omitempty"`
}

// WorkloadRow compares one traced configuration with untraced runs of the
// same rounds.
type WorkloadRow struct {
	Config           string   `json:"config"`
	Rounds           int      `json:"rounds"`
	RolloutsPerS     float64  `json:"rollouts_per_s"`
	Throughput       Interval `json:"throughput_ratio"`
	P50              Interval `json:"p50_latency_ratio"`
	P99              Interval `json:"p99_latency_ratio"`
	P50Ms            float64  `json:"p50_ms"`
	P99Ms            float64  `json:"p99_ms"`
	StackCPU         Interval `json:"stack_cpu_ratio"` // servers' CPU per rollout (incl. eBPF) vs untraced
	TracerCPUPct     float64  `json:"tracer_cpu_pct_of_stack"`
	TracerCPUMsRoll  float64  `json:"tracer_cpu_ms_per_rollout"`
	RequestsPerRoll  float64  `json:"requests_per_rollout"`
	EBPFNsPerReq     Interval `json:"ebpf_ns_per_request"`           // traced servers' syscalls only
	EBPFHostNsPerReq float64  `json:"ebpf_ns_per_request_incl_host"` // every run of every program, / requests
	HitsPerReq       float64  `json:"probe_hits_per_request"`        // the servers' syscalls on gymtrace's hooks
	SpansPerRoll     float64  `json:"spans_per_rollout"`
	RecordsPerRoll   float64  `json:"records_per_rollout"`
	BytesPerRoll     float64  `json:"bytes_per_rollout"`
	RingbufFailed    float64  `json:"ringbuf_reserve_failures"`
	PeakRSSMB        float64  `json:"tracer_peak_rss_mb"`
	Target           float64  `json:"throughput_target,omitempty"`
	Verdict          string   `json:"verdict,omitempty"`
	// GymTelemetry: Gym's own in-process telemetry, not gymtrace (spans
	// per rollout are its spans; its cost is all in the stack CPU).
	GymTelemetry    bool    `json:"gym_telemetry,omitempty"`
	GymSpansDropped float64 `json:"gym_spans_dropped,omitempty"`
}

// ProgramRow is one BPF program's cost under one configuration, over all
// rounds. "Target" figures are the traced servers' syscalls; "host" figures
// are every other process's syscalls, which stop at the target check.
type ProgramRow struct {
	Config         string  `json:"config"`
	Program        string  `json:"program"`
	Type           string  `json:"type"`
	Hits           uint64  `json:"hits"` // all runs, host included
	NsPerHit       float64 `json:"ns_per_hit"`
	TargetHits     uint64  `json:"target_hits"`
	TargetNsPerHit float64 `json:"target_ns_per_hit"`
	HostNsPerHit   float64 `json:"host_ns_per_hit"`
	HitsPerReq     float64 `json:"target_hits_per_request"`
	NsPerReq       float64 `json:"target_ns_per_request"`
	UprobeTraps    bool    `json:"uprobe,omitempty"` // a uprobe: each hit also pays a trap not in run_time_ns
}

type TaxRow struct {
	Syscall    string   `json:"syscall"`
	UntracedNs float64  `json:"untraced_ns"`
	EmptyNs    float64  `json:"empty_program_ns"`
	GymtraceNs float64  `json:"gymtrace_ns"`
	Floor      Interval `json:"floor_ns"`       // empty - untraced
	AboveFloor Interval `json:"above_floor_ns"` // gymtrace - empty
	OnGymHook  bool     `json:"on_gymtrace_hook"`
	Verdict    string   `json:"verdict,omitempty"`
}

// TrapRow is what one kernel entry of a kind costs on this host (tax phase):
// a syscall, and the round trip of a uprobe on an emulated instruction with
// an empty program, alone and with its return probe. gymtrace's context-copy
// probe pays the last on every copy, its uvloop write probe the middle one;
// neither shows in bpf_stats.
type TrapRow struct {
	Entry string   `json:"entry"`
	Ns    Interval `json:"ns"`
}

type CapacityRow struct {
	Exporter        string   `json:"exporter"`
	Rate            int      `json:"offered_rate"`
	Reps            int      `json:"reps"`
	SpansPerS       float64  `json:"spans_per_s"`
	CoresUsed       float64  `json:"cores_used"`
	CPUMsPer1000    Interval `json:"cpu_ms_per_1000_spans"`
	SpansPerCoreSec float64  `json:"spans_per_core_second"`
	Requests        float64  `json:"requests"`
	SpansBuilt      float64  `json:"spans_built"`
	RingbufFailed   float64  `json:"ringbuf_reserve_failures"`
	SpansDropped    float64  `json:"spans_dropped"`
	PeakRSSMB       float64  `json:"peak_rss_mb"`       // VmHWM, start-up included
	LoadRSSMB       float64  `json:"rss_under_load_mb"` // max VmRSS sampled under load
	Verdict         string   `json:"verdict"`
}

type GateRow struct {
	Mode           string   `json:"mode"`
	NoGateInKernel bool     `json:"no_gate_in_kernel"`
	RecordsPerRoll float64  `json:"records_per_rollout"`
	BytesPerRoll   float64  `json:"bytes_per_rollout"`
	TracerCPUMs    float64  `json:"tracer_cpu_ms_per_rollout"`
	EBPFNsPerReq   Interval `json:"ebpf_ns_per_request"`
	Throughput     Interval `json:"throughput_ratio"`
	SpansPerRoll   float64  `json:"spans_per_rollout"`
}

type TargetRow struct {
	What     string `json:"what"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Verdict  string `json:"verdict"`
}

// complete reports what the table lacks, for the smoke test.
func (rep *Report) complete(phases map[string]bool) error {
	var miss []string
	if phases["workload"] {
		have := map[string]bool{}
		for _, w := range rep.Workload {
			have[w.Config] = w.Rounds > 0 && (strings.HasPrefix(w.Config, "untraced") || w.Throughput.Valid())
		}
		traced := false
		for _, c := range workloadRows(rep.Settings.Baseline != "", rep.Settings.Configs, rep.Machine.Mode == "short") {
			if rep.Skipped[c.Name] != "" {
				continue // skipped, with a note naming what is missing
			}
			traced = traced || c.Traced
			if !have[c.Name] {
				miss = append(miss, "workload row "+c.Name)
			}
		}
		if len(rep.Programs) == 0 && traced {
			miss = append(miss, "per-program bpf_stats")
		}
		gateRows := slices.ContainsFunc(pick(workloadConfigs, rep.Settings.Configs), func(c wlConfig) bool { return c.NoGate })
		if gateRows && len(rep.Gate) != 2 {
			miss = append(miss, "gate vs no-gate rows")
		}
	}
	if phases["tax"] && len(rep.Tax) != len(loopKinds) {
		miss = append(miss, "untargeted tax rows")
	}
	twinSkipped := false // the phase ran, but its rows could not (noted)
	for k := range rep.Skipped {
		twinSkipped = twinSkipped || strings.HasPrefix(k, "twin: ")
	}
	if phases["twin"] && len(rep.Twin) == 0 && !twinSkipped {
		miss = append(miss, "twin rows")
	}
	if phases["capacity"] && len(rep.Capacity) == 0 {
		miss = append(miss, "agent capacity rows")
	}
	if len(miss) > 0 {
		return fmt.Errorf("%w: missing %s", errIncomplete, strings.Join(miss, ", "))
	}
	return nil
}

// skipNotes are the table's notes for rows that could not run, one per reason.
func skipNotes(skipped map[string]string) []string {
	var order []string
	rows := map[string][]string{}
	for _, c := range rowConfigs(true) {
		if w := skipped[c.Name]; w != "" {
			if rows[w] == nil {
				order = append(order, w)
			}
			rows[w] = append(rows[w], c.Name)
		}
	}
	var out []string
	for _, w := range order {
		out = append(out, fmt.Sprintf("skipped rows %q: %s", rows[w], w))
	}
	return out
}
