//go:build linux

package loader

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// programFrames is stackFrames of a program's instructions.
func programFrames(ps *ebpf.ProgramSpec) (map[string]int, map[string][]string) {
	return stackFrames(ps.Instructions)
}

// stackFrames returns each function's stack depth (the furthest byte below
// r10 it touches, by a load, a store, or a pointer it passes on) and the
// functions it calls, directly or as a callback (bpf_loop): the verifier
// counts a callback's frame on top of its caller's.
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
		if ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer() {
			if ref := ins.Reference(); ref != "" {
				calls[fn] = append(calls[fn], ref)
			}
		}
	}
	return depth, calls
}

// deepestChain is the largest sum of frames over the call chains from fn,
// each frame rounded up to round bytes as the verifier does: 16 for JITed
// programs on recent kernels, 32 on older ones (6.1 rounds every frame, at
// least one byte, up to 32).
func deepestChain(fn string, depth map[string]int, calls map[string][]string, round int) (int, []string) {
	return chainFrom(fn, depth, calls, round, nil)
}

func chainFrom(fn string, depth map[string]int, calls map[string][]string, round int, seen map[string]bool) (int, []string) {
	if seen[fn] {
		return 0, nil // recursion is refused by the verifier anyway
	}
	next := map[string]bool{fn: true}
	for k := range seen {
		next[k] = true
	}
	frame := (max(depth[fn], 1) + round - 1) / round * round
	best, chain := 0, []string(nil)
	for _, c := range calls[fn] {
		if d, ch := chainFrom(c, depth, calls, round, next); d > best {
			best, chain = d, ch
		}
	}
	return frame + best, append([]string{fn}, chain...)
}
