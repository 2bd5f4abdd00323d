//go:build linux

package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// analyse turns raw runs into the report's rows.
func (rep *Report) analyse() {
	rep.analyseWorkload()
	rep.analyseTax()
	rep.analyseTraps()
	rep.analyseCapacity()
	rep.analyseTwin()
	rep.targets()
	rep.twinTargets()
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
	for _, cfg := range rowConfigs(rep.Settings.Baseline != "") {
		rounds := byRound[cfg.Name]
		if rounds == nil {
			continue
		}
		base := byRound[baseOf(cfg)]
		row := WorkloadRow{Config: cfg.Name, Target: throughputTargets[cfg.Name], GymTelemetry: cfg.GymTel != ""}
		var thr, p50, p99, scpu, ebpf, rps, p50ms, p99ms []float64
		var rollouts, requests, hits, spans, ringBytes, records, tracerCPU, stackBase, failed, hwm, hostRT, dropped float64
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
			if ok && cfg.compared() {
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
			dropped += run.GymSpansDropped
			hwm = math.Max(hwm, float64(run.TracerHWMB)/1e6)
		}
		if row.Rounds == 0 {
			continue
		}
		row.RolloutsPerS = mean(rps)
		row.P50Ms, row.P99Ms = mean(p50ms), mean(p99ms)
		row.RequestsPerRoll = requests / rollouts
		row.HitsPerReq = hits / requests
		if cfg.compared() {
			row.Throughput, row.P50, row.P99, row.StackCPU = RatioCI(thr), RatioCI(p50), RatioCI(p99), RatioCI(scpu)
			row.SpansPerRoll = spans / rollouts
			row.GymSpansDropped = dropped
		}
		if cfg.Traced {
			row.EBPFHostNsPerReq = hostRT / requests
			row.EBPFNsPerReq = MeanCI(ebpf)
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

// taxByMode indexes the tax loop's runs: mode -> round -> kind -> ns.
func taxByMode(runs []taxRun) map[string]map[int]map[string]float64 {
	by := map[string]map[int]map[string]float64{}
	for _, r := range runs {
		if by[r.Mode] == nil {
			by[r.Mode] = map[int]map[string]float64{}
		}
		by[r.Mode][r.Round] = r.NsPer
	}
	return by
}

func (rep *Report) analyseTax() {
	if len(rep.Raw.Tax) == 0 {
		return
	}
	by := taxByMode(rep.Raw.Tax)
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

// analyseTraps: the uprobe modes' trapTarget calls less the untraced mode's,
// paired per round; the untraced getppid beside them as the syscall's price.
func (rep *Report) analyseTraps() {
	by := taxByMode(rep.Raw.Tax)
	if len(by["uprobe"]) == 0 && len(by["uretprobe"]) == 0 {
		return
	}
	var sys []float64
	for _, u := range by["untraced"] {
		sys = append(sys, u["getppid"])
	}
	rep.Traps = append(rep.Traps, TrapRow{Entry: "syscall (getppid, untraced)", Ns: MeanCI(sys)})
	for _, m := range []struct{ mode, entry string }{
		{"uprobe", trapUprobe},
		{"uretprobe", trapUretprobe},
	} {
		var d []float64
		for r, u := range by["untraced"] {
			if p, ok := by[m.mode][r]; ok {
				d = append(d, p[trapKind]-u[trapKind])
			}
		}
		rep.Traps = append(rep.Traps, TrapRow{Entry: m.entry, Ns: MeanCI(d)})
	}
}

// The uprobe rows of table 3b.
const (
	trapUprobe    = "uprobe hit (emulated instruction, empty program)"
	trapUretprobe = "uprobe + return probe (empty program)"
)

// probeTrapNs is this host's measured price of an entry probe's and of a
// return probe's round trip (empty program), when the tax phase ran.
func (rep *Report) probeTrapNs() (entry, ret float64, ok bool) {
	for _, t := range rep.Traps {
		switch {
		case !t.Ns.Valid():
		case t.Entry == trapUprobe:
			entry = t.Ns.Mean
		case t.Entry == trapUretprobe:
			ret = t.Ns.Mean
		}
	}
	return entry, ret, entry > 0 && ret > 0
}

// trapNs is the measured uprobe round trip (entry probe, empty program), or
// the one measured on the earlier host when the tax phase did not run.
func (rep *Report) trapNs() (ns float64, measured bool) {
	if entry, _, _ := rep.probeTrapNs(); entry > 0 {
		return entry, true
	}
	return uprobeTrapNs, false
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
