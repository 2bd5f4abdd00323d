package gymmetrics

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/pressure"
)

// Process and host pressure: Gym's gauges (nemo_gym/telemetry/gym_metrics.py)
// with its names and units, from the readings internal/pressure takes of
// /proc. Like every gym.* instrument they carry no attributes: the process
// is the resource. The host's memory goes on every traced process's
// resource, as in Gym, where each process reports the node's figure: a
// dashboard written for Gym's series finds them where it looks, by
// service_name and host.name. So every process on a host reports the same
// host value; aggregate it with max, not sum.
const (
	ProcessCPU      = "gym.process.cpu.percent"
	ProcessTreeCPU  = "gym.process_tree.cpu.percent"
	ProcessTreeMem  = "gym.process_tree.memory_used_mib"
	HostMemoryUsed  = "gym.host.memory_used_mib"
	HostMemoryTotal = "gym.host.memory_total_mib"
)

// ProcPressure is one traced process's reading.
type ProcPressure struct {
	Proc    *discover.Process
	Reading pressure.Reading
}

// pressureNow is the last sample, read by the gauges' callbacks.
type pressureNow struct {
	procs map[procKey]pressure.Reading
	host  pressure.Host
}

// SetPressure takes a sample: a reading per traced process (every one of
// them gets its metrics now, with or without traffic) and the host's
// memory. Processes left out report no pressure until the next sample
// that has them.
func (r *Recorder) SetPressure(procs []ProcPressure, host pressure.Host) {
	now := &pressureNow{procs: make(map[procKey]pressure.Reading, len(procs)), host: host}
	r.mu.Lock()
	if !r.closed {
		for _, pp := range procs {
			if pp.Proc == nil {
				continue
			}
			// A process with metrics keeps its provider whatever identity
			// made it: its spans may name it by the role its traffic showed
			// (spans.Builder.effProc), which discovery's record does not
			// have, and the two must not replace each other's provider at
			// every sample.
			k := procKey{pp.Proc.PID, pp.Proc.StartTime}
			if r.procs[k] != nil || r.procLocked(pp.Proc) != nil {
				now.procs[k] = pp.Reading
			}
		}
	}
	r.mu.Unlock()
	r.press.Store(now)
}

// pressureGauges registers pr's five gauges. They report the last sample
// while the process runs: nothing before its first sample, nothing once it
// exited (Gone), and no CPU until a sample has an interval behind it.
func (pr *proc) pressureGauges(r *Recorder) {
	m := pr.m
	cpu, err1 := m.Float64ObservableGauge(ProcessCPU, metric.WithUnit("%"),
		metric.WithDescription("This process's CPU utilization, in percent of one logical core, sampled from /proc."))
	tree, err2 := m.Float64ObservableGauge(ProcessTreeCPU, metric.WithUnit("%"),
		metric.WithDescription("This process's CPU utilization plus its full child-process tree, sampled from /proc."))
	treeMem, err3 := m.Float64ObservableGauge(ProcessTreeMem, metric.WithUnit("MiB"),
		metric.WithDescription("This process's RSS plus its full child-process tree, sampled from /proc."))
	used, err4 := m.Float64ObservableGauge(HostMemoryUsed, metric.WithUnit("MiB"),
		metric.WithDescription("This node's used memory (psutil's definition), sampled from /proc/meminfo."))
	total, err5 := m.Float64ObservableGauge(HostMemoryTotal, metric.WithUnit("MiB"),
		metric.WithDescription("This node's total memory, sampled from /proc/meminfo."))
	for _, err := range []error{err1, err2, err3, err4, err5} {
		if err != nil {
			r.cfg.Log.Warn("gym metrics: no pressure gauges for this process", "pid", pr.p.PID, "err", err)
			return
		}
	}
	key := procKey{pr.p.PID, pr.p.StartTime}
	_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		now := r.press.Load()
		if now == nil || pr.gone.Load() != 0 {
			return nil
		}
		rd, ok := now.procs[key]
		if !ok {
			return nil
		}
		if rd.HasCPU {
			o.ObserveFloat64(cpu, rd.CPU)
		}
		if rd.HasTreeCPU {
			o.ObserveFloat64(tree, rd.TreeCPU)
		}
		o.ObserveFloat64(treeMem, rd.TreeMiB)
		if now.host.TotalMiB > 0 {
			o.ObserveFloat64(used, now.host.UsedMiB)
			o.ObserveFloat64(total, now.host.TotalMiB)
		}
		return nil
	}, cpu, tree, treeMem, used, total)
}
