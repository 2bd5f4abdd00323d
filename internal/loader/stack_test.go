//go:build linux

package loader

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// The verifier bounds a program's combined stack, the frames of the deepest
// chain of BPF-to-BPF calls, at 512 bytes (MAX_BPF_STACK), each frame rounded
// up to 16 bytes with the JIT. Kernels with BPF private stacks (6.13+, x86-64)
// skip that check for tracing programs whose frames are large, so a chain
// over 512 bytes loads on one 6.18 build and is refused by the next one.
// This test holds every program of the committed object to the limit
// itself, without root and whatever the running kernel does.
const maxCombinedStack = 512

func TestCombinedStackWithinLimit(t *testing.T) {
	for _, obj := range []string{"bpf_x86_bpfel.o", "bpf_arm64_bpfel.o"} {
		t.Run(obj, func(t *testing.T) { checkCombinedStack(t, obj) })
	}
}

func checkCombinedStack(t *testing.T, obj string) {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range spec.Programs {
		depth, calls := stackFrames(p.Instructions)
		total, chain := deepestChain(p.Name, depth, calls, nil)
		var parts []string
		for _, f := range chain {
			parts = append(parts, fmt.Sprintf("%s(%d)", f, depth[f]))
		}
		t.Logf("%-26s %3d bytes: %s", name, total, strings.Join(parts, " -> "))
		if total > maxCombinedStack {
			t.Errorf("program %s: its deepest call chain needs %d bytes of stack, over the verifier's %d (kernels without private stacks refuse it): %s; move locals to per-CPU map memory or split the frames that are live together (see gt_headers)",
				name, total, maxCombinedStack, strings.Join(parts, " -> "))
		}
	}
}

// stackFrames returns each function's stack depth (the furthest byte below
// r10 it touches, by a load, a store, or a pointer it passes on) and the
// functions it calls.
func stackFrames(insns asm.Instructions) (map[string]int, map[string][]string) {
	depth := map[string]int{}
	calls := map[string][]string{}
	fn := ""
	for i, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			fn = sym
			depth[fn] += 0
		}
		off := 0
		switch {
		case ins.OpCode.Class().IsLoad() && ins.Src == asm.R10:
			off = -int(ins.Offset)
		case ins.OpCode.Class().IsStore() && ins.Dst == asm.R10:
			off = -int(ins.Offset)
		case ins.OpCode.Class().IsALU() && ins.OpCode.ALUOp() == asm.Add && ins.OpCode.Source() == asm.ImmSource &&
			i > 0 && insns[i-1].OpCode.ALUOp() == asm.Mov && insns[i-1].Src == asm.R10 &&
			insns[i-1].OpCode.Source() == asm.RegSource && insns[i-1].Dst == ins.Dst:
			off = -int(ins.Constant) // rX = r10; rX += -N: &local passed on
		}
		if off > depth[fn] {
			depth[fn] = off
		}
		if ins.IsFunctionCall() {
			if ref := ins.Reference(); ref != "" {
				calls[fn] = append(calls[fn], ref)
			}
		}
	}
	return depth, calls
}

// deepestChain is the largest sum of frames, each rounded up to 16 bytes as
// the verifier does for JITed programs, over the call chains from fn.
func deepestChain(fn string, depth map[string]int, calls map[string][]string, seen map[string]bool) (int, []string) {
	if seen[fn] {
		return 0, nil // recursion is refused by the verifier anyway
	}
	next := map[string]bool{fn: true}
	for k := range seen {
		next[k] = true
	}
	frame := (max(depth[fn], 1) + 15) / 16 * 16
	best, chain := 0, []string(nil)
	for _, c := range calls[fn] {
		if d, ch := deepestChain(c, depth, calls, next); d > best {
			best, chain = d, ch
		}
	}
	return frame + best, append([]string{fn}, chain...)
}
