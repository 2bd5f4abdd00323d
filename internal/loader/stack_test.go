//go:build linux

package loader

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// The verifier bounds a program's combined stack, the frames of the deepest
// chain of BPF-to-BPF calls (a bpf_loop callback's frame on top of its
// caller's), at 512 bytes (MAX_BPF_STACK). It rounds each frame up to 16
// bytes for JITed programs from Linux 6.9, to 32 bytes (at least 32) before
// (StackRounding). Kernels with BPF private stacks (6.13+, x86-64) skip the
// check for tracing programs with large frames, so a chain over the limit
// loads on one 6.18 build and is refused by the next one. This test holds
// every program of the committed objects to the limit itself, without root
// and whatever the running kernel does: the bounded-loop build, which
// kernels before 6.4 get, with 32-byte frames to the budget kernel-matrix
// holds every kernel to (stackBudget); the iterator build with 16-byte
// frames to the budget and with 32-byte ones (6.4 to 6.8) to the limit.
const (
	maxCombinedStack = 512
	stackBudget      = 448
)

func TestCombinedStackWithinLimit(t *testing.T) {
	for _, c := range []struct {
		obj          string
		round, limit int
	}{
		{"bpf_x86_bpfel.o", 16, stackBudget},
		{"bpf_x86_bpfel.o", 32, maxCombinedStack},
		{"bpf_arm64_bpfel.o", 16, stackBudget},
		{"bpf_arm64_bpfel.o", 32, maxCombinedStack},
		{"bpfbounded_x86_bpfel.o", 32, stackBudget},
		{"bpfbounded_arm64_bpfel.o", 32, stackBudget},
		{"bpfk510_x86_bpfel.o", 32, stackBudget},
		{"bpfk510_arm64_bpfel.o", 32, stackBudget},
	} {
		t.Run(fmt.Sprintf("%s/%d", c.obj, c.round), func(t *testing.T) { checkCombinedStack(t, c.obj, c.round, c.limit) })
	}
}

func checkCombinedStack(t *testing.T, obj string, round, limit int) {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range spec.Programs {
		depth, calls := stackFrames(p.Instructions)
		total, chain := deepestChain(p.Name, depth, calls, round)
		var parts []string
		for _, f := range chain {
			parts = append(parts, fmt.Sprintf("%s(%d)", f, depth[f]))
		}
		t.Logf("%-26s %3d bytes: %s", name, total, strings.Join(parts, " -> "))
		if total > limit {
			t.Errorf("program %s: its deepest call chain needs %d bytes of stack with frames rounded to %d bytes, over %d: %s; move locals to per-CPU map memory or split the frames that are live together (see gt_headers)",
				name, total, round, limit, strings.Join(parts, " -> "))
		}
	}
}
