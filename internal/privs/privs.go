//go:build linux

// Package privs gives up the Linux capabilities gymtrace no longer needs once
// its BPF programs are loaded and attached.
//
// Loading programs, creating maps and attaching tracepoints need CAP_BPF and
// CAP_PERFMON (or CAP_SYS_ADMIN), but everything the tracer does afterwards on
// the objects it already holds (map reads and writes through open map fds,
// the mmap'd ring buffer, closing links at exit) needs no capability on
// kernels since 6.4. What it still does that is privileged is reading other
// processes' /proc entries (discovery, and the re-inspection of --pid
// targets at every rescan) and, when enabled, attaching uprobes to processes
// found later. DropAfterAttach keeps exactly those and drops the rest from the
// effective, permitted, inheritable, ambient and bounding sets, so neither
// gymtrace nor anything it could be made to exec can get them back.
//
// Capabilities are per thread; the Go runtime runs many. The drop goes through
// libcap's psx, which applies each change to every thread of the process
// (with and without cgo), where a plain capset(2) would change one thread only.
// docs/security.md lists the capabilities per feature.
package privs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/gymtrace/gymtrace/internal/kversion"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/cap"
)

// Needs is what the tracer still does after attaching.
type Needs struct {
	// Discovery: the watcher reads /proc/PID/{environ,exe,cwd,root} of target
	// and candidate processes (of any user) at rescans and on exec/fork
	// events. gymtrace run always needs it: even with --pid only, every
	// rescan re-inspects the named processes.
	Discovery bool
	// Uprobes: uprobes are attached to processes found after start (Python
	// context, TLS libraries), which loads nothing new but opens perf events
	// and the processes' binaries.
	Uprobes bool
}

// Capabilities that features need after attach. A need may be met by an
// alternative (CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON on kernels
// before 5.8 and in containers granted only SYS_ADMIN).
type need struct {
	c   cap.Value
	alt cap.Value // 0 (CAP_CHOWN) is never an alternative: it means none
	why string
}

func (n Needs) list(mapAccessNeedsBPF bool) []need {
	var out []need
	if n.Discovery || n.Uprobes {
		out = append(out,
			need{c: cap.SYS_PTRACE, why: "read other processes' /proc/PID/environ, exe, root (discovery)"},
			need{c: cap.DAC_READ_SEARCH, why: "open /proc/PID/environ of other users and files inside containers"})
	}
	if n.Uprobes {
		out = append(out,
			// Measured on Linux 6.18: with CAP_PERFMON, CAP_BPF and
			// CAP_CHECKPOINT_RESTORE but not CAP_SYS_ADMIN, opening a uprobe
			// perf event on a target found after the drop fails with EACCES
			// (the asyncio and TLS probes of every later target were lost).
			need{c: cap.SYS_ADMIN, why: "open uprobe perf events for processes found later (refused with CAP_PERFMON alone)"},
			need{c: cap.PERFMON, alt: cap.SYS_ADMIN, why: "open uprobe perf events for processes found later"},
			need{c: cap.BPF, alt: cap.SYS_ADMIN, why: "attach programs to those perf events"},
			need{c: cap.CHECKPOINT_RESTORE, alt: cap.SYS_ADMIN, why: "open /proc/PID/map_files/* inside containers"})
	}
	if mapAccessNeedsBPF && !n.Uprobes {
		out = append(out, need{c: cap.BPF, alt: cap.SYS_ADMIN,
			why: "update maps (targets, gate) through their fds: this kernel checks CAP_BPF on every bpf() call"})
	}
	return out
}

// Report says what a drop did.
type Report struct {
	Kept    []string // capability names still effective, sorted
	Dropped []string // names that were permitted before and are not now
	// BoundingReduced is false when the bounding set could not be reduced
	// (no CAP_SETPCAP): an exec'd root program could then regain the rest.
	BoundingReduced bool
}

// Drop reduces the process's capabilities to what n needs (of those it has).
func Drop(n Needs) (Report, error) {
	var rep Report
	cur := cap.GetProc()
	have := func(v cap.Value) bool {
		ok, err := cur.GetFlag(cap.Permitted, v)
		return err == nil && ok
	}

	keep := map[cap.Value]bool{}
	for _, nd := range n.list(bpfChecksEveryCall()) {
		switch {
		case have(nd.c):
			keep[nd.c] = true
		case nd.alt != 0 && have(nd.alt):
			keep[nd.alt] = true
		}
	}

	// Bounding, ambient and inheritable first: dropping bounding-set bits
	// needs CAP_SETPCAP, which the capset below gives up.
	iab := cap.NewIAB() // empty inheritable and ambient vectors
	var bound []cap.Value
	for v := cap.Value(0); v < cap.MaxBits(); v++ {
		if !keep[v] {
			bound = append(bound, v)
		}
	}
	if err := iab.SetVector(cap.Bound, true, bound...); err != nil {
		return rep, fmt.Errorf("building the bounding set: %w", err)
	}
	if setpcap, _ := cur.GetFlag(cap.Effective, cap.SETPCAP); setpcap {
		if err := iab.SetProc(); err != nil {
			return rep, fmt.Errorf("reducing the bounding, inheritable and ambient sets: %w", err)
		}
		rep.BoundingReduced = true
	} else if err := cap.ResetAmbient(); err != nil && !errors.Is(err, unix.EPERM) {
		return rep, fmt.Errorf("clearing the ambient set: %w", err)
	}

	next := cap.NewSet()
	for v := range keep {
		if err := next.SetFlag(cap.Permitted, true, v); err != nil {
			return rep, err
		}
		if err := next.SetFlag(cap.Effective, true, v); err != nil {
			return rep, err
		}
	}
	if err := next.SetProc(); err != nil {
		return rep, fmt.Errorf("setting capabilities to %s: %w", next, err)
	}

	now := cap.GetProc()
	for v := cap.Value(0); v < cap.MaxBits(); v++ {
		eff, _ := now.GetFlag(cap.Effective, v)
		prm, _ := now.GetFlag(cap.Permitted, v)
		if eff {
			rep.Kept = append(rep.Kept, Name(v))
		}
		if have(v) && !prm {
			rep.Dropped = append(rep.Dropped, Name(v))
		}
	}
	sort.Strings(rep.Kept)
	sort.Strings(rep.Dropped)
	return rep, nil
}

// DropAfterAttach is Drop for the tracer: it logs what it kept, and a warning
// (never a failure: the tracer works either way) when it could not drop.
func DropAfterAttach(log *slog.Logger, n Needs) {
	rep, err := Drop(n)
	if err != nil {
		log.Warn("could not drop capabilities after attaching; gymtrace keeps running with all it was started with",
			"err", err)
		return
	}
	kept := strings.Join(rep.Kept, ",")
	if kept == "" {
		kept = "none"
	}
	log.Info("capabilities dropped after attach", "kept", kept, "dropped", len(rep.Dropped))
	if !rep.BoundingReduced && len(rep.Dropped) > 0 {
		log.Debug("bounding set not reduced (no CAP_SETPCAP); capabilities are gone from this process but an exec'd root program could regain them")
	}
}

// Name is the kernel's name for a capability: CAP_SYS_PTRACE.
func Name(v cap.Value) string { return strings.ToUpper(v.String()) }

// bpfChecksEveryCall reports whether this kernel refuses bpf() map
// operations on an already open fd to a process without CAP_BPF. Kernels
// before 6.4 checked the capability at the syscall's entry for every command
// when unprivileged BPF is disabled (the usual setting); 6.4 moved the check
// to map creation and program loading.
func bpfChecksEveryCall() bool {
	major, minor, ok := kversion.Running()
	if !ok || major > 6 || major == 6 && minor >= 4 {
		return !ok
	}
	b, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	if err != nil {
		return true
	}
	return strings.TrimSpace(string(b)) != "0"
}
