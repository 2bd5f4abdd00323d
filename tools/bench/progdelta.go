//go:build linux

package main

import (
	"math"
	"sort"
)

// progDelta is one program's bpf_stats over a run.
type progDelta struct {
	ID        uint32 `json:"id"`
	Name      string `json:"name"`
	Type      string `json:"type"`
	Hits      uint64 `json:"hits"`       // every run, any process on the host
	RuntimeNs uint64 `json:"runtime_ns"` // their total run time
	// TargetHits are the runs in the traced servers (from the hit counter;
	// 0 for programs not on a syscall hook).
	TargetHits uint64 `json:"target_hits"`
	// The idle window just before the run: only the rest of the host
	// (and a few idle syscalls of the servers) ran the program, which gives
	// the cost of a hit that stops at the target check.
	IdleHits       uint64 `json:"idle_hits"`
	IdleTargetHits uint64 `json:"idle_target_hits"`
	IdleRuntimeNs  uint64 `json:"idle_runtime_ns"`
}

// targetsOnly: a program that runs for the traced servers alone, so all its
// hits are counted as theirs: a uprobe fires only in processes that map the
// probed binary (here the traced Python servers), and the sk_msg program
// only for sockets in the injection sockhash (the targets' outbound ones).
func (p progDelta) targetsOnly() bool { return p.Type == "Kprobe" || p.Type == "SkMsg" }

// targetHits are the runs on behalf of the traced servers.
func (p progDelta) targetHits() uint64 {
	if p.targetsOnly() {
		return p.Hits
	}
	return p.TargetHits
}

// hostNsPerHit is the cost of a run of this program for a process that is
// not traced, from the idle window; NaN when the window saw none.
func (p progDelta) hostNsPerHit() float64 {
	if p.targetsOnly() || p.IdleHits <= p.IdleTargetHits {
		return math.NaN()
	}
	return float64(p.IdleRuntimeNs) / float64(p.IdleHits-p.IdleTargetHits)
}

// targetRuntimeNs is the run time spent on the traced servers' syscalls:
// the total less the host's hits at the idle cost per hit.
func (p progDelta) targetRuntimeNs() float64 {
	if p.targetsOnly() {
		return float64(p.RuntimeNs)
	}
	if p.TargetHits == 0 {
		return 0
	}
	c := p.hostNsPerHit()
	if math.IsNaN(c) {
		c = 0
	}
	rt := float64(p.RuntimeNs) - float64(p.Hits-min(p.Hits, p.TargetHits))*c
	return math.Max(rt, 0)
}

// progDeltas: idle window [ki, k0], run [k0, k1]; h* are the hit counter's
// readings at the same moments.
func progDeltas(ki, k0, k1 kernelSnap, hi, h0, h1 map[string]uint64) []progDelta {
	var out []progDelta
	for id, p1 := range k1.Progs {
		p0, pi := k0.Progs[id], ki.Progs[id]
		d := progDelta{ID: id, Hits: p1.RunCnt - p0.RunCnt, RuntimeNs: p1.RunTimeNs - p0.RunTimeNs,
			IdleHits: p0.RunCnt - pi.RunCnt, IdleRuntimeNs: p0.RunTimeNs - pi.RunTimeNs}
		if meta, err := programMeta(id); err == nil {
			d.Name, d.Type = meta.Name, meta.Type
		}
		if h := hookOfProgram(d.Name); h != "" && d.Type == "TracePoint" {
			d.TargetHits = h1[h] - h0[h]
			d.IdleTargetHits = h0[h] - hi[h]
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
