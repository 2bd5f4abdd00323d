// Package probesite decides where in a function a uprobe goes so that the
// kernel emulates the instruction it traps on.
//
// x86-64 uprobes emulate a few instructions (push %reg, call rel32, jmp and
// jcc with a relative target) and single-step every other one out of line,
// which costs about 20 µs a hit on this kind of machine against about 1 µs.
// CET builds (Debian 13 and later) start every function with endbr64, which
// is single-stepped, so a probe at a symbol's address is the expensive kind
// there. arm64 uprobes simulate the usual prologue instructions, so on other
// machines the entry is always taken as it is.
package probesite

import (
	"debug/elf"
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// Entry is where an entry probe on the function at vaddr goes, as an offset
// from vaddr: past a leading endbr64 (it changes no register, so the
// arguments are still in place), and whether the instruction there is
// emulated. It never moves further: an entry program reads the argument
// registers, which the next instructions may already have changed.
func Entry(f *elf.File, vaddr uint64) (off uint64, cheap bool, err error) {
	if f.Machine != elf.EM_X86_64 {
		return 0, true, nil
	}
	code, err := ReadVaddr(f, vaddr, 8)
	if err != nil {
		return 0, false, err
	}
	if IsEndbr64(code) {
		off = 4
		code = code[4:]
	}
	return off, IsEmulated(code), nil
}

// How many instructions Return walks looking for an emulated one.
const maxPrefix = 16

// Return is where a return probe on the function at vaddr, size bytes long,
// goes, as an offset from vaddr, and whether the instruction there is
// emulated.
//
// A return probe takes the return address from the top of the stack when it
// is hit, so it can sit on any instruction that every call executes once,
// while the stack is still as the call left it. Return walks the function's
// straight-line start (no branch, nothing that moves, reads or addresses
// %rsp) and takes its first emulated instruction, provided no branch of the
// function leads back to it or before it (a second hit in one call would
// run the program twice for one return). CPython 3.14's
// PyContext_CopyCurrent, for one, starts `endbr64; mov %fs:..,%rdx;
// mov ..,%rax; test %rax,%rax; je`: the je is emulated. When the start holds
// none, or size is not known (0), the answer is Entry's.
func Return(f *elf.File, vaddr, size uint64) (off uint64, cheap bool, err error) {
	off, cheap, err = Entry(f, vaddr)
	if err != nil || cheap || size == 0 || size > maxFunc { // Entry is cheap off x86-64
		return off, cheap, err
	}
	code, err := ReadVaddr(f, vaddr, int(size))
	if err != nil || uint64(len(code)) != size {
		return off, false, nil
	}
	if at, ok := straightLineSite(code, off); ok && !branchesTo(code, at) {
		return at, true, nil
	}
	return off, false, nil
}

// maxFunc bounds the functions Return decodes whole.
const maxFunc = 64 << 10

// branchesTo reports whether some relative branch or call in code (a whole
// function, decoded from its first byte) targets an offset at or below
// site, or whether code cannot be decoded to its end (then nothing is
// known, so the answer is yes).
func branchesTo(code []byte, site uint64) bool {
	for pc := uint64(0); pc < uint64(len(code)); {
		if IsEndbr64(code[pc:]) {
			pc += 4
			continue
		}
		inst, err := x86asm.Decode(code[pc:], 64)
		if err != nil || inst.Len == 0 {
			return true
		}
		next := pc + uint64(inst.Len)
		for _, a := range inst.Args {
			if rel, ok := a.(x86asm.Rel); ok {
				if t := int64(next) + int64(rel); t >= 0 && uint64(t) <= site {
					return true
				}
			}
		}
		pc = next
	}
	return false
}

// straightLineSite walks code (a function's first bytes) from offset at and
// returns the offset of the first emulated instruction, if only
// instructions that keep the stack come before it.
func straightLineSite(code []byte, at uint64) (uint64, bool) {
	for range maxPrefix {
		if at >= uint64(len(code)) {
			return 0, false
		}
		c := code[at:]
		if IsEmulated(c) {
			return at, true
		}
		inst, err := x86asm.Decode(c, 64)
		if err != nil || !keepsStack(inst) {
			return 0, false
		}
		at += uint64(inst.Len)
	}
	return 0, false
}

// keepsStack: inst is one that neither changes control flow nor reads,
// writes or addresses %rsp (so the return address is still on top after
// it, and no earlier exit can skip the probe). Only plain data moves and
// arithmetic are accepted; anything else ends the straight-line start.
func keepsStack(inst x86asm.Inst) bool {
	switch inst.Op {
	case x86asm.MOV, x86asm.MOVZX, x86asm.MOVSX, x86asm.MOVSXD, x86asm.LEA,
		x86asm.TEST, x86asm.CMP, x86asm.XOR, x86asm.AND, x86asm.OR, x86asm.ADD, x86asm.SUB, x86asm.NOP:
	default:
		return false
	}
	for _, a := range inst.Args {
		switch a := a.(type) {
		case nil:
		case x86asm.Reg:
			if a == x86asm.RSP || a == x86asm.ESP || a == x86asm.SP || a == x86asm.SPB || a == x86asm.RIP {
				return false
			}
		case x86asm.Mem:
			if a.Base == x86asm.RSP || a.Base == x86asm.ESP || a.Index == x86asm.RSP {
				return false
			}
		case x86asm.Imm, x86asm.Rel:
		default:
			return false
		}
	}
	return true
}

// IsEndbr64 reports whether c starts with endbr64 (f3 0f 1e fa).
func IsEndbr64(c []byte) bool {
	return len(c) >= 4 && c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa
}

// IsEmulated reports whether c starts with an instruction the x86 uprobe
// code emulates: push %reg, push %r8-15, call rel32, jmp rel8/rel32, jcc
// rel8/rel32, each without prefixes (the kernel single-steps a branch with
// an operand-size prefix).
func IsEmulated(c []byte) bool {
	switch {
	case len(c) > 0 && c[0] >= 0x50 && c[0] <= 0x57:
		return true
	case len(c) > 1 && c[0] == 0x41 && c[1] >= 0x50 && c[1] <= 0x57:
		return true
	case len(c) > 0 && (c[0] == 0xe8 || c[0] == 0xe9 || c[0] == 0xeb || (c[0] >= 0x70 && c[0] <= 0x7f)):
		return true
	case len(c) > 1 && c[0] == 0x0f && c[1] >= 0x80 && c[1] <= 0x8f:
		return true
	}
	return false
}

// FileOffset converts a virtual address in an executable segment of f to
// the file offset uprobes are given.
func FileOffset(f *elf.File, vaddr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x is in no executable segment", vaddr)
}

// ReadVaddr reads up to n bytes at vaddr from the loaded segment holding
// it; fewer when the segment ends first.
func ReadVaddr(f *elf.File, vaddr uint64, n int) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || vaddr < p.Vaddr || vaddr >= p.Vaddr+p.Filesz {
			continue
		}
		if rest := p.Vaddr + p.Filesz - vaddr; uint64(n) > rest {
			n = int(rest)
		}
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(vaddr-p.Vaddr)); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x is in no loaded segment", vaddr)
}
