//go:build linux

package loader

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The words `gymtrace check` prints for a refused program, from the
// verifier's log as cilium/ebpf hands it over.
func TestExplainRefusal(t *testing.T) {
	stats := []string{"verification time 142000000 usec", "stack depth 72+40+104", "processed 1000001 insns (limit 1000000) max_states_per_insn 33 total_states 29210 peak_states 261 mark_read 0"}
	for _, c := range []struct {
		name     string
		err      error
		why, fix string
	}{
		{"too many instructions",
			&ebpf.VerifierError{Cause: errors.New("argument list too long"), Log: append([]string{"1220: (85) call pc+12", "BPF program is too large. Processed 1000001 insn"}, stats...)},
			"gave up after 1000001 instructions", "GYMTRACE_BPF_VARIANT"},
		{"too many pending branches",
			&ebpf.VerifierError{Cause: errors.New("argument list too long"), Log: append([]string{"The sequence of 8193 jumps is too complex."}, stats...)},
			"more branches", "docs/kernels.md"},
		{"stack",
			&ebpf.VerifierError{Cause: errors.New("permission denied"), Log: append([]string{"combined stack size of 6 calls is 544. Too large"}, stats...)},
			"needs 544 bytes of stack", "gymtrace bug"},
		{"kfunc",
			fmt.Errorf("program gt_exit_write: load program: %w", errors.New("unknown kfunc")),
			"kernel function (kfunc)", "GYMTRACE_BPF_VARIANT=bounded"},
		{"weak kfunc reached",
			&ebpf.VerifierError{Cause: errors.New("permission denied"), Log: append([]string{"61: (85) call unknown#233685214", "invalid func unknown#233685214"}, stats...)},
			"kernel function (kfunc)", "GYMTRACE_BPF_VARIANT=bounded"},
		{"helper",
			&ebpf.VerifierError{Cause: errors.New("invalid argument"), Log: append([]string{"0: (85) call bpf_get_current_pid_tgid#14", "unknown func bpf_get_current_pid_tgid#14"}, stats...)},
			"helper bpf_get_current_pid_tgid (#14)", "newer kernel"},
		{"no privilege",
			fmt.Errorf("load program: %w", unix.EPERM),
			"did not allow the load", "CAP_BPF"},
		{"anything else",
			&ebpf.VerifierError{Cause: errors.New("permission denied"), Log: append([]string{"128: (85) call bpf_probe_read_user#112", "R2 unbounded memory access, use 'var &= const' or 'if (var < const)'"}, stats...)},
			"R2 unbounded memory access", "gymtrace bug"},
	} {
		t.Run(c.name, func(t *testing.T) {
			why, fix := explainRefusal(c.err)
			if !strings.Contains(why, c.why) || !strings.Contains(fix, c.fix) {
				t.Errorf("explainRefusal:\n  why %q (want %q in it)\n  fix %q (want %q in it)", why, c.why, fix, c.fix)
			}
		})
	}
}
