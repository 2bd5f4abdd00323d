package probesite

import (
	"debug/elf"
	"fmt"
	"slices"
	"sort"

	"golang.org/x/arch/x86/x86asm"
)

// calleeSaved are the registers a call leaves as they were (System V
// x86-64): one the caller reads after a call without writing it held the
// same value at the call.
var calleeSaved = []x86asm.Reg{x86asm.RBX, x86asm.RBP, x86asm.R12, x86asm.R13, x86asm.R14, x86asm.R15}

// FindHolderCalls finds, in the function of f (x86-64) whose code holds
// the address at, the direct calls of symbol (defined or imported) after
// which the caller stores a 64-bit value at disp(%base), with %base a
// callee-saved register nothing writes between the call and the store,
// before anything branches away or into that stretch. An entry probe on
// such a call (a call rel32, which the kernel emulates) sees in %base the
// object the caller then writes into: each CallSite has Probe == Call,
// Reg the base register and Holder set. internal/python uses it to find
// Task.__init__'s inlined register_task (a thread-state lookup, then the
// stores into the Task's task_node).
//
// A build that reads the thread state inline from thread-local storage
// (clang with LTO: python-build-standalone's interpreter, where _asyncio
// is built in) has no such call. There a store at disp(%base) also counts
// when the straight-line stretch before it, from the closest instruction
// the kernel emulates, reads %fs-relative memory (the thread state) and
// writes no %base: the probe goes on that instruction (Probe == Call, a
// jcc or a call), which every pass through the stretch executes once.
func FindHolderCalls(f *elf.File, symbol string, at uint64, disp int64) ([]CallSite, error) {
	if f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("%w: call sites are found on x86-64 only", ErrNotCovered)
	}
	t := &tracker{f: f, targets: map[uint64]bool{}, slots: map[uint64]bool{}, keepAll: true}
	if err := t.resolve(symbol); err != nil {
		return nil, err
	}
	for a := range t.targets {
		t.named = append(t.named, a)
	}
	t.nearNamed = len(t.named)
	starts, err := functionStarts(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotCovered, err)
	}
	i := sort.Search(len(starts), func(i int) bool { return starts[i] > at }) - 1
	if i < 0 {
		return nil, fmt.Errorf("%#x is in no function of the file", at)
	}
	var fn *function
	// The next start bounds the function's code.
	err = t.eachFunction(starts[i:min(i+2, len(starts))], func(code []byte, start uint64) error {
		if fn != nil || start != starts[i] {
			return nil
		}
		var err error
		fn, err = t.decode(code, start)
		return err
	})
	if err != nil || fn == nil {
		return nil, err
	}
	if fn.indirect {
		return nil, fmt.Errorf("%w: the function at %#x jumps through a register or could not be decoded whole", ErrNotCovered, fn.start)
	}
	var out []CallSite
	for i, x := range fn.insts {
		if x.in.Op == x86asm.CALL && t.targets[relTarget(x.in, x.pc)] && IsEmulated(x.raw) {
			if base, ok := storeAfter(fn, i, disp); ok {
				out = append(out, CallSite{Call: x.pc, Probe: x.pc, Reg: base, Holder: true})
			}
		}
		if base, ok := holderStore(x, disp); ok {
			if p, ok := tlsBefore(fn, i, base); ok && !(p.in.Op == x86asm.CALL && t.targets[relTarget(p.in, p.pc)]) {
				out = append(out, CallSite{Call: p.pc, Probe: p.pc, Reg: base, Holder: true})
			}
		}
	}
	return out, nil
}

// holderStore: x is a 64-bit store at disp(%base), %base callee-saved.
func holderStore(x inst, disp int64) (x86asm.Reg, bool) {
	a, ok := x.in.Args[0].(x86asm.Mem)
	if ok && x.in.Op == x86asm.MOV && a.Disp == disp && a.Index == 0 && a.Segment == 0 && x.in.DataSize == 64 &&
		slices.Contains(calleeSaved, a.Base) {
		return a.Base, true
	}
	return 0, false
}

// tlsBefore: the closest emulated instruction before fn.insts[j] (a store
// through base), within maxAfterCall instructions, when the stretch after it
// up to the store is straight-line code no branch leads into, writes no
// base, and reads %fs-relative memory (the thread state, inlined).
func tlsBefore(fn *function, j int, base x86asm.Reg) (inst, bool) {
	if fn.targets[fn.insts[j].pc] {
		return inst{}, false
	}
	tls := false
	for k := j - 1; k >= 0 && k >= j-maxAfterCall-1; k-- {
		x := fn.insts[k]
		if IsEmulated(x.raw) {
			return x, tls
		}
		if fn.targets[x.pc] {
			return inst{}, false
		}
		switch x.in.Op {
		case x86asm.RET, x86asm.JMP, x86asm.CALL, x86asm.LCALL, x86asm.LJMP,
			x86asm.XCHG, x86asm.CMPXCHG, x86asm.XADD: // these also write their second operand
			return inst{}, false
		}
		if r, ok := x.in.Args[0].(x86asm.Reg); ok && family(r) == base {
			return inst{}, false
		}
		for _, a := range x.in.Args {
			if m, ok := a.(x86asm.Mem); ok && m.Segment == x86asm.FS {
				tls = true
			}
		}
	}
	return inst{}, false
}

// storeAfter: the base register of the first store to disp(%base) within
// maxAfterCall instructions after the call fn.insts[i], if %base is
// callee-saved and unwritten until then, and the stretch is straight-line
// code reached only from the call.
func storeAfter(fn *function, i int, disp int64) (x86asm.Reg, bool) {
	written := map[x86asm.Reg]bool{}
	for j := i + 1; j < len(fn.insts) && j <= i+maxAfterCall; j++ {
		x := fn.insts[j]
		if fn.targets[x.pc] || IsEmulated(x.raw) {
			return 0, false
		}
		switch x.in.Op {
		case x86asm.RET, x86asm.JMP, x86asm.CALL, x86asm.LCALL, x86asm.LJMP:
			return 0, false
		}
		switch a := x.in.Args[0].(type) {
		case x86asm.Reg:
			written[family(a)] = true
		case x86asm.Mem:
			if x.in.Op == x86asm.MOV && a.Disp == disp && a.Index == 0 && a.Segment == 0 && x.in.DataSize == 64 &&
				slices.Contains(calleeSaved, a.Base) && !written[a.Base] {
				return a.Base, true
			}
		}
	}
	return 0, false
}
