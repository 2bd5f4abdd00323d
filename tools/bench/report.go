//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
)

// Report is the whole benchmark: what scripts/bench prints and writes as JSON.
type Report struct {
	Machine  Machine       `json:"machine"`
	Settings Settings      `json:"settings"`
	Workload []WorkloadRow `json:"workload"`
	Programs []ProgramRow  `json:"programs"`
	Tax      []TaxRow      `json:"untargeted_tax"`
	Capacity []CapacityRow `json:"agent_capacity"`
	Gate     []GateRow     `json:"gate"`
	Targets  []TargetRow   `json:"targets"`
	Notes    []string      `json:"notes,omitempty"`
	Raw      RawRuns       `json:"raw"`
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
	Rounds      int      `json:"rounds"`
	Rollouts    int      `json:"rollouts"`
	Concurrency int      `json:"concurrency"`
	TaxRounds   int      `json:"tax_rounds"`
	TaxIters    int      `json:"tax_iterations"`
	CapSeconds  int      `json:"capacity_seconds"`
	CapReps     int      `json:"capacity_reps"`
	CapRates    []int    `json:"capacity_offered_rates"`
	RecordBytes uint64   `json:"ringbuf_record_bytes"`
	Phases      string   `json:"phases"`
	Configs     string   `json:"configs,omitempty"` // --configs filter`
	FloorHooks  []string `json:"floor_hooks,omitempty"`
}

type RawRuns struct {
	Workload []wlRun  `json:"workload,omitempty"`
	Tax      []taxRun `json:"tax,omitempty"`
	Capacity []capRun `json:"capacity,omitempty"`
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

// uprobeTrapNs is the cheapest uprobe trap measured on this kind of machine
// (an emulated first instruction, docs/performance.md); a single-stepped one
// costs about 18 us. bpf_stats does not see it.
const uprobeTrapNs = 1100

var throughputTargets = map[string]float64{"groups off": 0.995, "default": 0.98, "default, injection forced": 0.98, "per_rollout": 0.98, "all": 0.97,
	"default, Gym runtime": 0.98, "per_rollout, Gym runtime": 0.98}

// verdict compares an interval with a lower bound (higher is better) or an
// upper bound: "ok" or "MISS" by the mean, with "?" when the 95 % interval
// reaches across the target (more rounds would settle it).
func verdict(iv Interval, target float64, higherBetter bool) string {
	if !iv.Valid() {
		return "n/a"
	}
	ok := iv.Mean >= target
	across := iv.Lo < target && iv.Hi > target
	if !higherBetter {
		ok = iv.Mean <= target
	}
	v := "ok"
	if !ok {
		v = "MISS"
	}
	if across && iv.N > 1 {
		v += "?"
	}
	return v
}

// analyse turns raw runs into the report's rows.
func (rep *Report) analyse() {
	rep.analyseWorkload()
	rep.analyseTax()
	rep.analyseCapacity()
	rep.targets()
}

func (rep *Report) analyseWorkload() {
	runs := rep.Raw.Workload
	if len(runs) == 0 {
		return
	}
	byRound := map[string]map[int]wlRun{}
	for _, r := range runs {
		if byRound[r.Config] == nil {
			byRound[r.Config] = map[int]wlRun{}
		}
		byRound[r.Config][r.Round] = r
	}
	for _, cfg := range workloadConfigs {
		rounds := byRound[cfg.Name]
		if rounds == nil {
			continue
		}
		base := byRound[baseOf(cfg)]
		row := WorkloadRow{Config: cfg.Name, Target: throughputTargets[cfg.Name]}
		var thr, p50, p99, scpu, ebpf, rps, p50ms, p99ms []float64
		var rollouts, requests, hits, spans, ringBytes, records, tracerCPU, stackBase, failed, hwm, hostRT float64
		for r, run := range rounds {
			b, ok := base[r]
			if run.Invalid != "" || (ok && b.Invalid != "") {
				continue
			}
			row.Rounds++
			rps = append(rps, run.RolloutsPerS)
			p50ms = append(p50ms, run.P50Ms)
			p99ms = append(p99ms, run.P99Ms)
			rollouts += float64(run.Rollouts)
			requests += float64(run.Requests)
			if ok && cfg.Traced {
				thr = append(thr, run.RolloutsPerS/b.RolloutsPerS)
				p50 = append(p50, run.P50Ms/b.P50Ms)
				p99 = append(p99, run.P99Ms/b.P99Ms)
				scpu = append(scpu, (run.StackCPUMs/float64(run.Rollouts))/(b.StackCPUMs/float64(b.Rollouts)))
				stackBase += b.StackCPUMs / float64(b.Rollouts) * float64(run.Rollouts)
			}
			var rt, trt float64
			for _, p := range run.Progs {
				rt += float64(p.RuntimeNs)
				trt += p.targetRuntimeNs()
			}
			if run.Requests > 0 && cfg.Traced {
				ebpf = append(ebpf, trt/float64(run.Requests))
			}
			hostRT += rt
			hits += float64(run.TargetHits)
			spans += run.SpansBuilt
			ringBytes += float64(run.RingBytes)
			records += run.Records
			tracerCPU += run.TracerCPUMs
			failed += run.RingbufFailed
			hwm = math.Max(hwm, float64(run.TracerHWMB)/1e6)
		}
		if row.Rounds == 0 {
			continue
		}
		row.RolloutsPerS = mean(rps)
		row.P50Ms, row.P99Ms = mean(p50ms), mean(p99ms)
		row.RequestsPerRoll = requests / rollouts
		row.HitsPerReq = hits / requests
		if cfg.Traced {
			row.EBPFHostNsPerReq = hostRT / requests
			row.Throughput, row.P50, row.P99, row.StackCPU = RatioCI(thr), RatioCI(p50), RatioCI(p99), RatioCI(scpu)
			row.EBPFNsPerReq = MeanCI(ebpf)
			row.SpansPerRoll = spans / rollouts
			row.RecordsPerRoll = records / rollouts
			row.BytesPerRoll = ringBytes / rollouts
			row.TracerCPUMsRoll = tracerCPU / rollouts
			if stackBase > 0 {
				row.TracerCPUPct = 100 * tracerCPU / stackBase
			}
			row.RingbufFailed = failed
			row.PeakRSSMB = hwm
			if row.Target > 0 {
				row.Verdict = verdict(row.Throughput, row.Target, true)
			}
		}
		rep.Workload = append(rep.Workload, row)

		if !cfg.Traced {
			continue
		}
		// Per-program cost over all valid rounds of this configuration.
		type acc struct {
			typ                       string
			hits, rt, thits           uint64
			trt, idleRT, idleHostHits float64
		}
		progs := map[string]*acc{}
		for _, run := range rounds {
			if run.Invalid != "" {
				continue
			}
			for _, p := range run.Progs {
				name := p.Name
				if name == "" {
					name = fmt.Sprintf("prog#%d", p.ID)
				}
				a := progs[name]
				if a == nil {
					a = &acc{typ: p.Type}
					progs[name] = a
				}
				a.hits += p.Hits
				a.rt += p.RuntimeNs
				a.thits += p.targetHits()
				a.trt += p.targetRuntimeNs()
				if !p.targetsOnly() {
					a.idleRT += float64(p.IdleRuntimeNs)
					a.idleHostHits += float64(p.IdleHits - min(p.IdleHits, p.IdleTargetHits))
				}
			}
		}
		names := make([]string, 0, len(progs))
		for n := range progs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			a := progs[n]
			pr := ProgramRow{Config: cfg.Name, Program: n, Type: a.typ, Hits: a.hits, TargetHits: a.thits,
				UprobeTraps: a.typ == "Kprobe", NsPerHit: math.NaN(), TargetNsPerHit: math.NaN(), HostNsPerHit: math.NaN()}
			if a.hits > 0 {
				pr.NsPerHit = float64(a.rt) / float64(a.hits)
			}
			if a.thits > 0 {
				pr.TargetNsPerHit = a.trt / float64(a.thits)
			}
			if a.idleHostHits > 0 {
				pr.HostNsPerHit = a.idleRT / a.idleHostHits
			}
			if requests > 0 {
				pr.HitsPerReq = float64(a.thits) / requests
				pr.NsPerReq = a.trt / requests
			}
			rep.Programs = append(rep.Programs, pr)
		}
	}

	// The gate's worth: verify with and without the kernel gate.
	for _, name := range []string{"verify, gate", "verify, no gate"} {
		rounds := byRound[name]
		if rounds == nil {
			continue
		}
		var row *WorkloadRow
		for i := range rep.Workload {
			if rep.Workload[i].Config == name {
				row = &rep.Workload[i]
			}
		}
		if row == nil {
			continue
		}
		g := GateRow{Mode: strings.TrimPrefix(name, "verify, "), RecordsPerRoll: row.RecordsPerRoll,
			BytesPerRoll: row.BytesPerRoll, TracerCPUMs: row.TracerCPUMsRoll, EBPFNsPerReq: row.EBPFNsPerReq,
			Throughput: row.Throughput, SpansPerRoll: row.SpansPerRoll}
		g.NoGateInKernel = true
		for _, run := range rounds {
			if run.GateFlags&2 == 0 { // GT_CFG_NO_GATE
				g.NoGateInKernel = false
			}
		}
		rep.Gate = append(rep.Gate, g)
	}
	if len(rep.Gate) == 2 && !rep.Gate[1].NoGateInKernel {
		rep.Notes = append(rep.Notes, "the gymtrace under test ignores GYMTRACE_BENCH_NO_GATE=1 (gt_config.flags lacks GT_CFG_NO_GATE): the \"no gate\" row measured the gate")
	}
}

func (rep *Report) analyseTax() {
	runs := rep.Raw.Tax
	if len(runs) == 0 {
		return
	}
	by := map[string]map[int]map[string]float64{} // mode -> round -> kind -> ns
	for _, r := range runs {
		if by[r.Mode] == nil {
			by[r.Mode] = map[int]map[string]float64{}
		}
		by[r.Mode][r.Round] = r.NsPer
	}
	for _, kind := range loopKinds {
		row := TaxRow{Syscall: kind, OnGymHook: kind != "getppid"}
		var un, em, gt, floor, above []float64
		for r, u := range by["untraced"] {
			e, ok1 := by["empty"][r]
			g, ok2 := by["gymtrace"][r]
			if !ok1 || !ok2 {
				continue
			}
			un, em, gt = append(un, u[kind]), append(em, e[kind]), append(gt, g[kind])
			floor = append(floor, e[kind]-u[kind])
			above = append(above, g[kind]-e[kind])
		}
		row.UntracedNs, row.EmptyNs, row.GymtraceNs = Median(un), Median(em), Median(gt)
		row.Floor, row.AboveFloor = MeanCI(floor), MeanCI(above)
		if row.OnGymHook {
			row.Verdict = verdict(row.AboveFloor, 20, false)
		}
		rep.Tax = append(rep.Tax, row)
	}
}

func (rep *Report) analyseCapacity() {
	type key struct {
		exp  string
		rate int
	}
	by := map[key][]capRun{}
	var order []key
	for _, r := range rep.Raw.Capacity {
		k := key{r.Exporter, r.Rate}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	for _, k := range order {
		rs := by[k]
		row := CapacityRow{Exporter: k.exp, Rate: k.rate, Reps: len(rs)}
		var sps, cores, per1000, spc []float64
		for _, r := range rs {
			sps = append(sps, r.SpansPerS)
			cores = append(cores, r.CoresUsed)
			per1000 = append(per1000, r.CPUMsPer1000)
			spc = append(spc, r.SpansPerCoreSec)
			row.Requests += r.Requests
			row.SpansBuilt += r.SpansBuilt
			row.RingbufFailed += r.RingbufFailed
			row.SpansDropped += r.SpansDropped
			row.PeakRSSMB = math.Max(row.PeakRSSMB, float64(r.TracerPeakRSS)/1e6)
			row.LoadRSSMB = math.Max(row.LoadRSSMB, float64(r.TracerLoadRSS)/1e6)
		}
		row.SpansPerS, row.CoresUsed, row.SpansPerCoreSec = mean(sps), mean(cores), mean(spc)
		row.CPUMsPer1000 = MeanCI(per1000)
		lossless := row.RingbufFailed == 0 && row.SpansDropped == 0
		row.Verdict = "ok"
		if !lossless || row.SpansPerCoreSec < 50000 || row.LoadRSSMB > 100 {
			row.Verdict = "MISS"
		}
		rep.Capacity = append(rep.Capacity, row)
	}
}

func (rep *Report) targets() {
	add := func(what, target, measured, v string) {
		rep.Targets = append(rep.Targets, TargetRow{What: what, Target: target, Measured: measured, Verdict: v})
	}
	for _, w := range rep.Workload {
		if w.Target > 0 {
			add("throughput, "+w.Config, fmt.Sprintf(">= %.3f", w.Target), fmtIv(w.Throughput, 3), w.Verdict)
		}
	}
	for _, w := range rep.Workload {
		if w.Config == "default" || w.Config == "per_rollout" || w.Config == "all" {
			add("eBPF time per traced request, "+w.Config, "<= 1000 ns", fmtIv(w.EBPFNsPerReq, 0)+" ns", verdict(w.EBPFNsPerReq, 1000, false))
		}
	}
	var uprobes []string
	for _, p := range rep.Programs {
		if p.UprobeTraps && p.Hits > 0 {
			uprobes = append(uprobes, fmt.Sprintf("%s (%s): %.2f hits/req, %.0f ns/hit in the program, >= %.1f us/req of traps",
				p.Program, p.Config, p.HitsPerReq, p.TargetNsPerHit, p.HitsPerReq*uprobeTrapNs/1000))
		}
	}
	if len(rep.Programs) > 0 {
		m := "none attached"
		if len(uprobes) > 0 {
			m = strings.Join(uprobes, "; ")
		}
		add("uprobe hits per request (each also traps: >= 1.1 us emulated, ~18 us single-stepped; not in run_time_ns or the eBPF figure)", "counted", m, "info")
	}
	for _, t := range rep.Tax {
		if t.OnGymHook {
			add("untargeted tax above floor, "+t.Syscall, "<= 20 ns", fmtIv(t.AboveFloor, 1)+" ns", t.Verdict)
		}
	}
	for _, c := range rep.Capacity {
		add(fmt.Sprintf("agent capacity, %s, offered %s", c.Exporter, rateName(c.Rate)), ">= 50000 spans/core-s, no loss",
			fmt.Sprintf("%.0f spans/core-s at %.0f spans/s; %g ringbuf failures, %g spans dropped", c.SpansPerCoreSec, c.SpansPerS, c.RingbufFailed, c.SpansDropped),
			lossVerdict(c))
		add(fmt.Sprintf("RSS under load, %s, offered %s", c.Exporter, rateName(c.Rate)), "<= 100 MB",
			fmt.Sprintf("%.1f MB (peak since start %.1f MB)", c.LoadRSSMB, c.PeakRSSMB), map[bool]string{true: "ok", false: "MISS"}[c.LoadRSSMB <= 100])
	}
	if len(rep.Gate) == 2 && rep.Gate[0].BytesPerRoll > 0 {
		add("gate's worth (verify): bytes copied out, no gate / gate", "> 1", fmt.Sprintf("%.1fx", rep.Gate[1].BytesPerRoll/rep.Gate[0].BytesPerRoll), "info")
	}
}

func lossVerdict(c CapacityRow) string {
	if c.RingbufFailed == 0 && c.SpansDropped == 0 && c.SpansPerCoreSec >= 50000 {
		return "ok"
	}
	return "MISS"
}

func mean(xs []float64) float64 {
	xs = finite(xs)
	if len(xs) == 0 {
		return math.NaN()
	}
	m, _ := meanSD(xs)
	return m
}

func fmtIv(iv Interval, prec int) string {
	if !iv.Valid() {
		return "n/a"
	}
	if iv.N < 2 {
		return fmt.Sprintf("%.*f", prec, iv.Mean)
	}
	return fmt.Sprintf("%.*f [%.*f, %.*f]", prec, iv.Mean, prec, iv.Lo, prec, iv.Hi)
}

func fmtF(x float64, prec int) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", prec, x)
}

// complete reports what the table lacks, for the smoke test.
func (rep *Report) complete(phases map[string]bool) error {
	var miss []string
	if phases["workload"] {
		have := map[string]bool{}
		for _, w := range rep.Workload {
			have[w.Config] = w.Rounds > 0 && (strings.HasPrefix(w.Config, "untraced") || w.Throughput.Valid())
		}
		gymOK := gymRuntimeMissing() == ""
		for _, c := range pick(workloadConfigs, rep.Settings.Configs) {
			if c.Runtime == runtimeGym && !gymOK {
				continue // skipped, with a warning naming what is missing
			}
			if !have[c.Name] {
				miss = append(miss, "workload row "+c.Name)
			}
		}
		if len(rep.Programs) == 0 {
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
	if phases["capacity"] && len(rep.Capacity) == 0 {
		miss = append(miss, "agent capacity rows")
	}
	if len(miss) > 0 {
		return fmt.Errorf("%w: missing %s", errIncomplete, strings.Join(miss, ", "))
	}
	return nil
}

// table is one section of the printed table.
type table struct {
	title string
	rows  [][]string // rows[0] is the header
}

// tables lays the report out as sections, for text and Markdown alike.
func (rep *Report) tables() []table {
	var out []table
	s := rep.Settings
	if len(rep.Workload) > 0 {
		t := table{title: fmt.Sprintf("1. Gym-shaped workload: %d rollouts at concurrency %d, %d interleaved rounds; ratios traced/untraced, geometric mean [95%% CI]",
			s.Rollouts, s.Concurrency, s.Rounds)}
		t.rows = append(t.rows, []string{"config", "rollouts/s", "throughput", "p50 latency", "p99 latency", "stack CPU/rollout",
			"agent CPU % of stack", "eBPF ns/req", "hits/req", "spans/rollout", "records/rollout", "target", "verdict"})
		for _, r := range rep.Workload {
			if strings.HasPrefix(r.Config, "untraced") {
				t.rows = append(t.rows, []string{r.Config, fmtF(r.RolloutsPerS, 1), "1", fmtF(r.P50Ms, 1) + " ms", fmtF(r.P99Ms, 1) + " ms", "1", "", "", "", "", "", "", ""})
				continue
			}
			tgt := ""
			if r.Target > 0 {
				tgt = fmt.Sprintf(">= %.3f", r.Target)
			}
			t.rows = append(t.rows, []string{r.Config, fmtF(r.RolloutsPerS, 1), fmtIv(r.Throughput, 3), fmtIv(r.P50, 3), fmtIv(r.P99, 3),
				fmtIv(r.StackCPU, 3), fmtF(r.TracerCPUPct, 2), fmtIv(r.EBPFNsPerReq, 0), fmtF(r.HitsPerReq, 1),
				fmtF(r.SpansPerRoll, 1), fmtF(r.RecordsPerRoll, 1), tgt, r.Verdict})
		}
		out = append(out, t)
	}
	if len(rep.Programs) > 0 {
		cfgs := []string{"groups off", "default", "default, injection forced", "per_rollout", "all", "default, Gym runtime", "per_rollout, Gym runtime"}
		t := table{title: "2. Per-program cost from bpf_stats, per configuration: ns per hit on the traced servers' syscalls / their hits per HTTP request served; " +
			"host = ns per hit for every other process on the machine (stops at the target check), from an idle window before each run"}
		hdr := []string{"program", "type"}
		for _, c := range cfgs {
			hdr = append(hdr, c+": ns/hit", "hits/req", "host ns/hit")
		}
		t.rows = append(t.rows, hdr)
		byProg := map[string]map[string]ProgramRow{}
		var names []string
		for _, p := range rep.Programs {
			if byProg[p.Program] == nil {
				byProg[p.Program] = map[string]ProgramRow{}
				names = append(names, p.Program)
			}
			byProg[p.Program][p.Config] = p
		}
		sort.Strings(names)
		for _, n := range names {
			row := []string{n, ""}
			used := false
			for _, c := range cfgs {
				p, ok := byProg[n][c]
				if !ok {
					row = append(row, "-", "-", "-")
					continue
				}
				used = used || p.Hits > 0
				row[1] = p.Type
				row = append(row, fmtF(p.TargetNsPerHit, 0), fmtF(p.HitsPerReq, 2), fmtF(p.HostNsPerHit, 0))
			}
			if used {
				t.rows = append(t.rows, row)
			}
		}
		tot := []string{"traced servers: eBPF ns/req", ""}
		host := []string{"incl. the host's hits: eBPF ns/req", ""}
		for _, c := range cfgs {
			cell, hcell := []string{"-", "-", ""}, []string{"-", "", ""}
			for _, r := range rep.Workload {
				if r.Config == c {
					cell = []string{fmtIv(r.EBPFNsPerReq, 0), fmtF(r.HitsPerReq, 1), ""}
					hcell = []string{fmtF(r.EBPFHostNsPerReq, 0), "", ""}
				}
			}
			tot = append(tot, cell...)
			host = append(host, hcell...)
		}
		t.rows = append(t.rows, tot, host)
		out = append(out, t)
	}
	if len(rep.Tax) > 0 {
		t := table{title: fmt.Sprintf("3. Tax on an untargeted process: ns per syscall, median over %d rounds of the fastest of 20 batches of %d iterations; floor = an empty program on gymtrace's syscall hooks (%s); differences paired per round [95%% CI]",
			s.TaxRounds, s.TaxIters, strings.Join(s.FloorHooks, ", "))}
		t.rows = append(t.rows, []string{"syscall", "untraced", "empty program", "gymtrace", "floor (empty - untraced)", "above floor (gymtrace - empty)", "target", "verdict"})
		for _, x := range rep.Tax {
			tgt := ""
			if x.OnGymHook {
				tgt = "<= 20"
			}
			t.rows = append(t.rows, []string{x.Syscall, fmtF(x.UntracedNs, 1), fmtF(x.EmptyNs, 1), fmtF(x.GymtraceNs, 1),
				fmtIv(x.Floor, 1), fmtIv(x.AboveFloor, 1), tgt, x.Verdict})
		}
		out = append(out, t)
	}
	if len(rep.Capacity) > 0 {
		t := table{title: fmt.Sprintf("4. Agent capacity: wrk -t1 for %d s x %d against a compiled Go server (offered rate: rate/1000 connections with 1 ms Lua delay; max = 32 connections flat out); gymtrace pinned to one core, load on the other; span groups = server",
			s.CapSeconds, s.CapReps)}
		t.rows = append(t.rows, []string{"exporter", "offered req/s", "spans/s", "agent cores", "CPU ms / 1000 spans", "spans per core-s", "ringbuf failures", "dropped", "RSS under load MB", "peak RSS since start MB", "verdict"})
		for _, c := range rep.Capacity {
			t.rows = append(t.rows, []string{c.Exporter, rateName(c.Rate), fmtF(c.SpansPerS, 0), fmtF(c.CoresUsed, 2), fmtIv(c.CPUMsPer1000, 2),
				fmtF(c.SpansPerCoreSec, 0), fmt.Sprint(c.RingbufFailed), fmt.Sprint(c.SpansDropped), fmtF(c.LoadRSSMB, 1), fmtF(c.PeakRSSMB, 1), c.Verdict})
		}
		out = append(out, t)
	}
	if len(rep.Gate) > 0 {
		t := table{title: "5. The gate's worth (span groups = verify): kernel gate vs GYMTRACE_BENCH_NO_GATE=1 (every message copied out, filtered in Go)"}
		t.rows = append(t.rows, []string{"mode", "no-gate in kernel", "records/rollout", "bytes/rollout", "agent CPU ms/rollout", "eBPF ns/req", "throughput", "spans/rollout"})
		for _, g := range rep.Gate {
			t.rows = append(t.rows, []string{g.Mode, fmt.Sprint(g.NoGateInKernel), fmtF(g.RecordsPerRoll, 1), fmtF(g.BytesPerRoll, 0),
				fmtF(g.TracerCPUMs, 2), fmtIv(g.EBPFNsPerReq, 0), fmtIv(g.Throughput, 3), fmtF(g.SpansPerRoll, 1)})
		}
		out = append(out, t)
	}
	if len(rep.Targets) > 0 {
		t := table{title: "Targets"}
		t.rows = append(t.rows, []string{"what", "target", "measured", "verdict"})
		for _, x := range rep.Targets {
			t.rows = append(t.rows, []string{x.What, x.Target, x.Measured, x.Verdict})
		}
		out = append(out, t)
	}
	return out
}

func (rep *Report) header() string {
	m := rep.Machine
	return fmt.Sprintf("gymtrace benchmark (%s mode): %s, Linux %s, %d CPUs, %s, gymtrace %s, 1-min load average %.2f at start, %.2f at end",
		m.Mode, m.Date, m.Kernel, m.CPUs, m.GoVersion, m.Gymtrace, m.LoadAvgStart, m.LoadAvgEnd)
}

// Print writes the table for a terminal.
func (rep *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n%s\n", rep.header())
	for _, t := range rep.tables() {
		fmt.Fprintf(w, "\n%s\n", t.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, r := range t.rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		tw.Flush()
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w, "\n\"?\" after a verdict: the 95% interval reaches across the target (more rounds would settle it).")
}

// Markdown writes the same tables as Markdown (for docs/performance.md).
func (rep *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "%s\n", rep.header())
	for _, t := range rep.tables() {
		fmt.Fprintf(w, "\n**%s**\n\n", t.title)
		for i, r := range t.rows {
			cells := make([]string, len(r))
			for j, c := range r {
				cells[j] = strings.ReplaceAll(c, "|", "\\|")
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
			if i == 0 {
				fmt.Fprintf(w, "|%s\n", strings.Repeat(" --- |", len(r)))
			}
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
}
