//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
)

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
			if r.GymTelemetry {
				// In process: its whole cost is in the stack CPU; no eBPF, no agent.
				spans := fmtF(r.SpansPerRoll, 1)
				if r.GymSpansDropped > 0 {
					spans += fmt.Sprintf(" (%.0f dropped)", r.GymSpansDropped)
				}
				t.rows = append(t.rows, []string{r.Config, fmtF(r.RolloutsPerS, 1), fmtIv(r.Throughput, 3), fmtIv(r.P50, 3), fmtIv(r.P99, 3),
					fmtIv(r.StackCPU, 3), "in process", "-", fmtF(r.HitsPerReq, 1), spans, "-", "", ""})
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
		cfgs := []string{"groups off", "default", "default, injection forced", "per_rollout", "all", "default, Gym runtime", "per_rollout, Gym runtime",
			"default, sid", "per_rollout, sid"}
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
	if len(rep.Traps) > 0 {
		t := table{title: fmt.Sprintf("3b. What one kernel entry costs on this host: ns, mean over %d rounds of the tax loop's fastest batches [95%% CI]; uprobes on a push of the bench binary (the kind of site gymtrace uses), paired per round with the bare call. gymtrace's context-copy probe pays the last row on every asyncio context copy, its uvloop write probe the middle one",
			s.TaxRounds)}
		t.rows = append(t.rows, []string{"kernel entry", "ns"})
		for _, x := range rep.Traps {
			t.rows = append(t.rows, []string{x.Entry, fmtIv(x.Ns, 0)})
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
	if t, ok := rep.gymTelTable(); ok {
		out = append(out, t)
	}
	if t, ok := rep.twinTable(); ok {
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

// pctOver turns a ratio interval into percent above 1.
func pctOver(iv Interval) string {
	if !iv.Valid() {
		return "n/a"
	}
	p := func(x float64) float64 { return (x - 1) * 100 }
	if iv.N < 2 {
		return fmt.Sprintf("%+.1f %%", p(iv.Mean))
	}
	return fmt.Sprintf("%+.1f %% [%+.1f, %+.1f]", p(iv.Mean), p(iv.Lo), p(iv.Hi))
}

// gymTelTable sets gymtrace beside Gym's own telemetry on the runtimes that
// have both (from the rows of table 1).
func (rep *Report) gymTelTable() (table, bool) {
	byName := map[string]WorkloadRow{}
	for _, r := range rep.Workload {
		byName[r.Config] = r
	}
	t := table{title: "6. gymtrace against Gym's own in-process telemetry, same interpreter and loop: CPU per rollout above untraced, " +
		"% of the untraced servers' CPU [95% CI]; gymtrace's is in the servers (eBPF, uprobe traps) plus its agent's, Gym's all in the servers " +
		"(A: OTLP http/protobuf to a sink; B: no-op exporter, the lower bound)"}
	t.rows = append(t.rows, []string{"runtime", "span groups", "gymtrace: servers", "gymtrace: agent", "gymtrace: total",
		"Gym telemetry A (OTLP)", "Gym telemetry B (no-op)", "spans/rollout gymtrace / Gym"})
	for _, fam := range []string{"sid", "sid asyncio"} {
		for _, spec := range []string{"default", "per_rollout"} {
			g, okG := byName[spec+", "+fam]
			a, okA := byName["Gym telemetry "+spec+", OTLP, "+fam]
			b, okB := byName["Gym telemetry "+spec+", no-op, "+fam]
			if !okG && !okA && !okB {
				continue
			}
			cell := func(ok bool, r WorkloadRow) string {
				if !ok {
					return "-"
				}
				return pctOver(r.StackCPU)
			}
			agent, total, spans := "-", "-", "-"
			if okG {
				agent = fmt.Sprintf("%+.1f %%", g.TracerCPUPct)
				if g.StackCPU.Valid() {
					total = fmt.Sprintf("%+.1f %%", (g.StackCPU.Mean-1)*100+g.TracerCPUPct)
				}
			}
			gs, gy := "-", "-"
			if okG {
				gs = fmtF(g.SpansPerRoll, 1)
			}
			if okA {
				gy = fmtF(a.SpansPerRoll, 1)
			} else if okB {
				gy = fmtF(b.SpansPerRoll, 1)
			}
			spans = gs + " / " + gy
			t.rows = append(t.rows, []string{fam, spec, cell(okG, g), agent, total, cell(okA, a), cell(okB, b), spans})
		}
	}
	return t, len(t.rows) > 1
}
