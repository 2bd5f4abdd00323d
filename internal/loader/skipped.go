//go:build linux

package loader

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// ProgramStats is what SkippedRuns reads of a loaded program.
type ProgramStats interface {
	Stats() (*ebpf.ProgramStats, error)
}

// SkippedRuns sums the runs the kernel skipped of the given programs
// (bpf_prog_info recursion_misses): a syscall program does not run while
// another tracing program, or a bpf() map operation, holds the CPU's
// bpf_prog_active, and on a kernel that preempts there (PREEMPT_LAZY, sid's
// 7.2: its default) that holder can be preempted, so every syscall on that
// CPU until it runs again goes unseen, as a record lost in the kernel would
// (issue 37, a slow machine). Not in the ring-buffer counters: nothing was
// reserved.
func SkippedRuns[P ProgramStats](progs map[string]P) uint64 {
	var n uint64
	for _, p := range progs {
		if st, err := p.Stats(); err == nil && st != nil {
			n += st.RecursionMisses
		}
	}
	return n
}

// SkippedRunsBy gives each program's skipped runs, "name=count" in
// name order, the programs with none left out: which program the kernel
// skips tells why (a syscall program preempted halfway, a map operation
// holding bpf_prog_active).
func SkippedRunsBy[P ProgramStats](progs map[string]P) []string {
	var out []string
	for name, p := range progs {
		if st, err := p.Stats(); err == nil && st != nil && st.RecursionMisses > 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, st.RecursionMisses))
		}
	}
	slices.Sort(out)
	return out
}

// LoadedPrograms leaves out the programs not loaded (nil).
func LoadedPrograms(progs map[string]*ebpf.Program) map[string]*ebpf.Program {
	out := make(map[string]*ebpf.Program, len(progs))
	for name, p := range progs {
		if p != nil {
			out[name] = p
		}
	}
	return out
}
