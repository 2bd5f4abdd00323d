//go:build linux

package preflight

import (
	"errors"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

func (c *checker) bpfFix() string {
	if !c.caps.has(unix.CAP_BPF) && !c.caps.has(unix.CAP_SYS_ADMIN) {
		return "needs CAP_BPF (see the capability rows)"
	}
	return ""
}

// probeRow turns a cilium/ebpf feature probe into a row.
func (c *checker) probeRow(feature string, need Need, use string, err error, fix string) Result {
	r := Result{Feature: feature, Need: need, Detail: use}
	switch {
	case err == nil:
		r.Status = StatusOK
	case errors.Is(err, ebpf.ErrNotSupported):
		r.Status, r.Detail = StatusMissing, "not supported by this kernel"
		r.Fix = fix
	default:
		r.Status, r.Detail = StatusMissing, err.Error()
		if f := c.bpfFix(); f != "" {
			r.Fix = f
		} else {
			r.Fix = fix
		}
	}
	return r
}

func (c *checker) progTypes() {
	traceNeed := NeedOptional
	if c.o.Traceparent {
		traceNeed = NeedRequired
	}
	c.add(c.probeRow("prog: tracepoint", NeedRequired, "syscall tracepoints (HTTP capture)",
		features.HaveProgramType(ebpf.TracePoint), "enable CONFIG_BPF_EVENTS in the kernel"))
	c.add(c.probeRow("prog: raw_tracepoint", NeedOptional, "process exec/fork/exit events",
		features.HaveProgramType(ebpf.RawTracepoint), "enable CONFIG_BPF_EVENTS; without it new processes are found by rescans only"))
	c.add(c.probeRow("prog: sock_ops", traceNeed, "traceparent injection: connections into the sockhash",
		features.HaveProgramType(ebpf.SockOps), "enable CONFIG_CGROUP_BPF; traceparent is then not injected into requests to other hosts"))
	c.add(c.probeRow("prog: sk_msg", traceNeed, "traceparent injection: bpf_msg_push_data",
		features.HaveProgramType(ebpf.SkMsg), "enable CONFIG_BPF_STREAM_PARSER; traceparent is then not injected"))
	c.add(c.probeRow("prog: cgroup_skb", NeedUnused, "cgroup programs (not attached by gymtrace)",
		features.HaveProgramType(ebpf.CGroupSKB), "gymtrace does not need it"))

	// Kprobes: listed because other tracers need them; gymtrace does not.
	r := Result{Feature: "prog: kprobe", Need: NeedUnused}
	err := features.HaveProgramType(ebpf.Kprobe)
	_, evErr := os.Stat(c.tracefsOr(tracefsPath) + "/kprobe_events")
	switch {
	case err == nil && evErr == nil:
		r.Status, r.Detail = StatusOK, "available (gymtrace does not need it)"
	case err == nil:
		r.Status, r.Detail = StatusMissing, "not available: the kernel has no kprobe_events (CONFIG_KPROBES off); gymtrace does not need it"
	default:
		r.Status, r.Detail = StatusMissing, "not available: gymtrace does not need it"
	}
	c.add(r)
}

func (c *checker) tracefsOr(def string) string {
	if c.tracefs != "" {
		return c.tracefs
	}
	return def
}

func (c *checker) maps() {
	c.add(c.probeRow("map: ringbuf", NeedRequired, "event delivery to userspace",
		features.HaveMapType(ebpf.RingBuf), "Linux 5.8+ is needed for BPF_MAP_TYPE_RINGBUF"))
	c.add(c.probeRow("map: lru_hash", NeedRequired, "per-connection state",
		features.HaveMapType(ebpf.LRUHash), "Linux 4.10+ is needed for LRU hash maps"))
	need := NeedOptional
	if c.o.Traceparent {
		need = NeedRequired
	}
	c.add(c.probeRow("map: sockhash", need, "traceparent injection (sk_msg attach point)",
		features.HaveMapType(ebpf.SockHash), "enable CONFIG_BPF_STREAM_PARSER"))
}
