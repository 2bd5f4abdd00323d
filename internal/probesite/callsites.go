package probesite

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"

	"golang.org/x/arch/x86/x86asm"
)

// A CallSite is a call of the function FindCalls was asked about, and where
// an entry probe sees what it returned: Probe is the first instruction after
// the call that the kernel emulates, reached only from the call, with the
// return value still in Reg (a 64-bit register).
type CallSite struct {
	Call, Probe uint64 // virtual addresses in the file
	Reg         x86asm.Reg
	// Stores are the displacements of the 64-bit stores of the result to
	// memory through a base register (mov %reg, disp(%base)) between the
	// call and Probe: where the caller keeps it, e.g. the field of the
	// object it initialises (internal/python tells a Task's context by it).
	Stores []int64
	// Holder: Reg holds the object the caller stores into after the call,
	// not the call's result (FindHolderCalls); Probe is the call itself.
	Holder bool
}

// Calls is every way code in one x86-64 ELF file reaches a function: the
// direct call sites (an entry probe at each sees the result with one trap)
// and the functions that only tail-jump to it but are reached indirectly
// (a method table's wrapper): those need a return probe of their own.
type Calls struct {
	Sites   []CallSite
	Returns []uint64 // entry addresses of such wrappers
}

// ErrNotCovered: the file reaches the function in a way FindCalls cannot
// cover with call sites (its address is taken, a tail call from inside a
// function, a call whose result is not in a register at an emulated
// instruction, code it cannot decode). Whoever asked must then probe the
// function itself.
var ErrNotCovered = errors.New("not every call can be probed at its site")

// How far after a call FindCalls looks for an emulated instruction.
const maxAfterCall = 8

// FindCalls finds how the code of f (x86-64) reaches symbol, a function f
// defines (its .dynsym entry) or imports (through its PLT or GOT). Every
// function is decoded from its .eh_frame_hdr start, so a call is only ever
// found at an instruction boundary. No call at all is an empty Calls.
func FindCalls(f *elf.File, symbol string) (*Calls, error) {
	if f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("%w: call sites are found on x86-64 only", ErrNotCovered)
	}
	t := &tracker{f: f, targets: map[uint64]bool{}, slots: map[uint64]bool{}}
	if err := t.resolve(symbol); err != nil {
		return nil, err
	}
	if len(t.targets) == 0 && len(t.slots) == 0 {
		return &Calls{}, nil
	}
	starts, err := functionStarts(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotCovered, err)
	}
	funcs, err := t.decodeAll(starts)
	if err != nil {
		return nil, err
	}
	return t.calls(funcs)
}

// tracker holds what resolves to the function: its own address or PLT
// stubs (targets), and the GOT slots an indirect call goes through (slots).
type tracker struct {
	f        *elf.File
	targets  map[uint64]bool
	slots    map[uint64]bool
	wrappers map[uint64]bool // functions that are one jump to it (decodeAll, entryJump)
	// entries: where each function that starts with a jump has it.
	entries map[uint64]inst
	// named: the targets and wrappers, then the slots (mayName); the
	// first nearNamed are the ones a rel8 can lead to.
	named     []uint64
	nearNamed int
	defined   uint64 // the function's address when f defines it
	// keepAll: decode keeps every function, named or not (FindHolderCalls).
	keepAll bool
	code    map[*elf.Section][]byte // sectionData
}

// ripTarget is the address a RIP-relative memory operand of in (at pc)
// names, 0 if it has none.
func ripTarget(in x86asm.Inst, pc uint64) uint64 {
	for _, a := range in.Args {
		if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP {
			return uint64(int64(pc) + int64(in.Len) + m.Disp)
		}
	}
	return 0
}

// relTarget is a relative branch's target, 0 if in has none.
func relTarget(in x86asm.Inst, pc uint64) uint64 {
	for _, a := range in.Args {
		if r, ok := a.(x86asm.Rel); ok {
			return uint64(int64(pc) + int64(in.Len) + int64(r))
		}
	}
	return 0
}

type inst struct {
	pc  uint64
	in  x86asm.Inst
	raw []byte // its bytes
}

// function is one decoded function: its instructions, where its own
// branches lead, and whether it jumps through a register or a table (then
// any of its instructions may be a branch target).
type function struct {
	start    uint64
	insts    []inst
	targets  map[uint64]bool
	indirect bool
}

// decodeAll decodes every function and keeps those that name the function,
// a slot or a wrapper (the rest would cost the agent memory for nothing:
// an interpreter has about a million instructions). Wrappers are found
// first, from each function's first instruction.
func (t *tracker) decodeAll(starts []uint64) ([]*function, error) {
	t.entries = map[uint64]inst{}
	if err := t.eachFunction(starts, func(code []byte, start uint64) error {
		if j, ok := entryJump(code, start); ok {
			t.entries[start] = j
		}
		return nil
	}); err != nil {
		return nil, err
	}
	t.wrappers = map[uint64]bool{}
	for changed := true; changed; {
		changed = false
		for start, j := range t.entries {
			r, m := relTarget(j.in, j.pc), ripTarget(j.in, j.pc)
			if !t.wrappers[start] && (t.targets[r] || t.wrappers[r] || t.slots[m]) {
				t.wrappers[start], changed = true, true
			}
		}
	}
	for _, m := range []map[uint64]bool{t.targets, t.wrappers} {
		for a := range m {
			t.named = append(t.named, a)
		}
	}
	t.nearNamed = len(t.named) // a rel8 never leads to a GOT slot
	for a := range t.slots {
		t.named = append(t.named, a)
	}
	var out []*function
	err := t.eachFunction(starts, func(code []byte, start uint64) error {
		if !t.mayName(code, start) {
			return nil
		}
		fn, err := t.decode(code, start)
		if fn != nil {
			out = append(out, fn)
		}
		return err
	})
	return out, err
}

// framePair is what a build with frame pointers (clang's
// -fno-omit-frame-pointer, python-build-standalone's) makes of a function
// that only tail-calls another: push %rbp; mov %rsp,%rbp; pop %rbp; jmp.
var framePair = []byte{0x55, 0x48, 0x89, 0xe5, 0x5d}

// entryJump is the jump a function starts with, after endbr64 and a frame
// set up and torn down again (framePair), which leave the stack as the
// caller left it: such a function is a wrapper when the jump leads to the
// function.
func entryJump(code []byte, start uint64) (inst, bool) {
	at := 0
	if IsEndbr64(code) {
		at = 4
	}
	if len(code) >= at+len(framePair) && string(code[at:at+len(framePair)]) == string(framePair) {
		at += len(framePair)
	}
	in, err := x86asm.Decode(code[at:], 64)
	if err != nil || in.Op != x86asm.JMP {
		return inst{}, false
	}
	return inst{pc: start + uint64(at), in: in}, true
}

// mayName: some 4-byte field of code, read as a displacement that ends its
// instruction (rel32, RIP-relative disp32), or some byte read as a rel8,
// leads to the function, a wrapper or a slot. Only such functions are
// decoded: a byte scan is two orders of magnitude faster than decoding, and
// an interpreter has megabytes of code that never names the function.
func (t *tracker) mayName(code []byte, start uint64) bool {
	want, near := t.named, t.named[:t.nearNamed]
	for i := range code {
		if i+4 <= len(code) {
			to := uint64(int64(start) + int64(i) + 4 + int64(int32(binary.LittleEndian.Uint32(code[i:]))))
			if slices.Contains(want, to) {
				return true
			}
		}
		if to := uint64(int64(start) + int64(i) + 1 + int64(int8(code[i]))); slices.Contains(near, to) {
			return true
		}
	}
	return false
}

// eachFunction calls do with the bytes of every function of f's executable
// sections, from its start to the next (padding included).
func (t *tracker) eachFunction(starts []uint64, do func(code []byte, start uint64) error) error {
	for _, s := range t.f.Sections {
		if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		switch s.Name {
		case ".plt", ".plt.sec", ".plt.got", ".init", ".fini":
			continue
		}
		code, err := t.sectionData(s)
		if err != nil {
			return err
		}
		lo := sort.Search(len(starts), func(i int) bool { return starts[i] >= s.Addr })
		for i := lo; i < len(starts) && starts[i] < s.Addr+s.Size; i++ {
			end := s.Addr + s.Size
			if i+1 < len(starts) && starts[i+1] < end {
				end = starts[i+1]
			}
			if err := do(code[starts[i]-s.Addr:end-s.Addr], starts[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// sectionData reads s once per tracker (decodeAll walks the code twice).
func (t *tracker) sectionData(s *elf.Section) ([]byte, error) {
	if b, ok := t.code[s]; ok {
		return b, nil
	}
	var b []byte
	var err error
	if s.Flags&elf.SHF_COMPRESSED != 0 {
		b, err = s.Data()
	} else {
		// Section.Data grows its buffer as it reads: the size is known.
		b = make([]byte, s.Size)
		_, err = s.ReadAt(b, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", s.Name, err)
	}
	if t.code == nil {
		t.code = map[*elf.Section][]byte{}
	}
	t.code[s] = b
	return b, nil
}

// decode decodes one function; nil when it names neither the function, a
// slot nor a wrapper. An undecodable instruction ends the decoding, unless
// the undecoded rest may name one of them (mayName; then nothing is known).
func (t *tracker) decode(code []byte, start uint64) (*function, error) {
	fn := &function{start: start, targets: map[uint64]bool{}}
	keep := false
	for pc := 0; pc < len(code); {
		if IsEndbr64(code[pc:]) {
			fn.insts = append(fn.insts, inst{pc: start + uint64(pc), in: x86asm.Inst{Op: x86asm.NOP, Len: 4}, raw: code[pc : pc+4]})
			pc += 4
			continue
		}
		in, err := x86asm.Decode(code[pc:], 64)
		if err != nil || in.Len == 0 {
			if t.mayName(code[pc:], start+uint64(pc)) {
				return nil, fmt.Errorf("%w: undecodable code at %#x may call it", ErrNotCovered, start+uint64(pc))
			}
			fn.indirect = true
			break
		}
		at := start + uint64(pc)
		fn.insts = append(fn.insts, inst{pc: at, in: in, raw: code[pc : pc+in.Len]})
		if r, m := relTarget(in, at), ripTarget(in, at); t.targets[r] || t.wrappers[r] || t.targets[m] || t.wrappers[m] || t.slots[m] {
			keep = true
		}
		switch in.Op {
		case x86asm.JMP:
			if r := relTarget(in, at); r != 0 {
				fn.targets[r] = true
			} else if ripTarget(in, at) == 0 {
				// A jump table: its targets are branch targets too.
				// Any other computed jump leaves them unknown.
				tab, ok := t.jumpTable(fn.insts)
				fn.indirect = fn.indirect || !ok
				for _, r := range tab {
					fn.targets[r] = true
				}
			}
		case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JCXZ, x86asm.JE, x86asm.JECXZ, x86asm.JG, x86asm.JGE,
			x86asm.JL, x86asm.JLE, x86asm.JNE, x86asm.JNO, x86asm.JNP, x86asm.JNS, x86asm.JO, x86asm.JP, x86asm.JRCXZ, x86asm.JS,
			x86asm.LOOP, x86asm.LOOPE, x86asm.LOOPNE:
			fn.targets[relTarget(in, at)] = true
		}
		pc += in.Len
	}
	if !keep && !t.keepAll {
		return nil, nil
	}
	return fn, nil
}

// calls sorts the references: wrappers (functions that are one jump to the
// function, or to another wrapper), the call sites of the function and of
// wrappers only ever called directly, and the wrappers that need a return
// probe (their address is taken, or nothing calls them).
func (t *tracker) calls(funcs []*function) (*Calls, error) {
	wrappers := t.wrappers
	taken := map[uint64]bool{}
	for w := range wrappers {
		if t.f.Type == elf.ET_EXEC && t.dataHolds(w) || t.relativeTo(w) {
			taken[w] = true
		}
	}
	for _, fn := range funcs {
		for _, x := range fn.insts {
			if x.in.Op == x86asm.LEA && wrappers[ripTarget(x.in, x.pc)] {
				taken[ripTarget(x.in, x.pc)] = true
			}
		}
	}
	called := map[uint64]bool{}
	out := &Calls{}
	for _, fn := range funcs {
		for i, x := range fn.insts {
			rt, mt := relTarget(x.in, x.pc), ripTarget(x.in, x.pc)
			hit := t.targets[rt] || wrappers[rt] || t.slots[mt]
			switch {
			case !hit && !t.targets[mt]:
				continue
			case x.in.Op == x86asm.CALL && taken[rt]:
				// The wrapper's return probe sees this call.
			case x.in.Op == x86asm.CALL && hit:
				site, err := afterCall(fn, i)
				if err != nil {
					return nil, err
				}
				called[rt] = true
				out.Sites = append(out.Sites, site)
			case x.in.Op == x86asm.JMP && wrappers[fn.start] && x.pc == t.entries[fn.start].pc:
				// The wrapper's own jump.
			case x.in.Op == x86asm.JMP && taken[rt]:
			default:
				return nil, fmt.Errorf("%w: %v at %#x", ErrNotCovered, x.in, x.pc)
			}
		}
	}
	for w := range wrappers {
		if taken[w] || !called[w] {
			out.Returns = append(out.Returns, w)
		}
	}
	slices.Sort(out.Returns)
	return out, nil
}

// afterCall finds where an entry probe sees the result of fn.insts[i], a
// call: the first emulated instruction after it, if only plain moves,
// arithmetic and compares come before it, nothing branches into them, and
// the result is still in a register there.
func afterCall(fn *function, i int) (CallSite, error) {
	call := fn.insts[i].pc
	fail := func(why string) (CallSite, error) {
		return CallSite{}, fmt.Errorf("%w: the call at %#x: %s", ErrNotCovered, call, why)
	}
	if fn.indirect {
		return fail("its function jumps through a register or could not be decoded whole")
	}
	live := map[x86asm.Reg]bool{x86asm.RAX: true}
	var stores []int64
	for j := i + 1; j < len(fn.insts) && j <= i+maxAfterCall; j++ {
		x := fn.insts[j]
		if fn.targets[x.pc] {
			return fail(fmt.Sprintf("a branch leads to %#x", x.pc))
		}
		if IsEmulated(x.raw) {
			for _, r := range resultRegs {
				if live[r] {
					return CallSite{Call: call, Probe: x.pc, Reg: r, Stores: stores}, nil
				}
			}
			return fail("the result is in no register")
		}
		switch x.in.Op {
		case x86asm.TEST, x86asm.CMP, x86asm.BT, x86asm.NOP:
			continue
		case x86asm.MOV, x86asm.MOVZX, x86asm.MOVSX, x86asm.MOVSXD, x86asm.LEA, x86asm.ADD, x86asm.SUB, x86asm.AND,
			x86asm.OR, x86asm.XOR, x86asm.SHL, x86asm.SHR, x86asm.SAR, x86asm.INC, x86asm.DEC, x86asm.NEG, x86asm.NOT:
		default:
			return fail(fmt.Sprintf("%v at %#x", x.in, x.pc))
		}
		dst, ok := x.in.Args[0].(x86asm.Reg)
		src, _ := x.in.Args[1].(x86asm.Reg)
		if !ok {
			// A store: no register changes.
			if m, isMem := x.in.Args[0].(x86asm.Mem); isMem && x.in.Op == x86asm.MOV && live[src] &&
				m.Base != 0 && m.Index == 0 && m.Segment == 0 {
				stores = append(stores, m.Disp)
			}
			continue
		}
		copyOf := x.in.Op == x86asm.MOV && family(dst) == dst && live[src]
		delete(live, family(dst))
		if copyOf {
			live[dst] = true
		}
		if len(live) == 0 {
			return fail("the result is overwritten")
		}
	}
	return fail("no emulated instruction follows it closely")
}

// resultRegs are the registers a probe can read the result from (the order
// in which FindCalls prefers them); %rsp is not one.
var resultRegs = []x86asm.Reg{x86asm.RAX, x86asm.RBX, x86asm.RCX, x86asm.RDX, x86asm.RSI, x86asm.RDI, x86asm.RBP,
	x86asm.R8, x86asm.R9, x86asm.R10, x86asm.R11, x86asm.R12, x86asm.R13, x86asm.R14, x86asm.R15}

// family is the 64-bit register r is part of (writing a part changes it).
func family(r x86asm.Reg) x86asm.Reg {
	switch {
	case r >= x86asm.RAX && r <= x86asm.R15:
		return r
	case r >= x86asm.EAX && r <= x86asm.R15L:
		return x86asm.RAX + (r - x86asm.EAX)
	case r >= x86asm.AX && r <= x86asm.R15W:
		return x86asm.RAX + (r - x86asm.AX)
	case r >= x86asm.AL && r <= x86asm.R15B:
		// AL CL DL BL AH CH DH BH SPB BPB SIB DIB R8B..: the high bytes
		// share the first four.
		if i := r - x86asm.AL; i < 4 {
			return x86asm.RAX + i
		} else {
			return x86asm.RAX + i - 4
		}
	}
	return r
}

// jumpTable reads the targets of the jump table that the last of insts
// (jmp *%reg) dispatches through, in the shape GCC and Clang give a switch in
// position-independent code:
//
//	cmp $N-1, X; ja default; ...; lea TABLE(%rip), B; movslq (B,I,4), R; add B, R; jmp *R
//
// The entries are int32 offsets from TABLE, N of them by the bound check.
// Anything else is reported as unknown.
func (t *tracker) jumpTable(insts []inst) ([]uint64, bool) {
	k := len(insts) - 1
	var table uint64
	var base x86asm.Reg
	n, scaled := int64(-1), false
	for j := k - 1; j > 0 && j >= k-16; j-- {
		in := insts[j].in
		switch {
		case in.Op == x86asm.MOVSXD:
			if m, ok := in.Args[1].(x86asm.Mem); ok && m.Scale == 4 {
				base, scaled = m.Base, true
			}
		case in.Op == x86asm.LEA && table == 0 && scaled && in.Args[0] == base:
			table = ripTarget(in, insts[j].pc)
		case in.Op == x86asm.JA && n < 0 && insts[j-1].in.Op == x86asm.CMP:
			if imm, ok := insts[j-1].in.Args[1].(x86asm.Imm); ok {
				n = int64(imm) + 1
			}
		}
	}
	if table == 0 || n <= 0 || n > 4096 {
		return nil, false
	}
	b, err := ReadVaddr(t.f, table, int(4*n))
	if err != nil || len(b) != int(4*n) {
		return nil, false
	}
	out := make([]uint64, 0, n)
	for i := range int(n) {
		out = append(out, uint64(int64(table)+int64(int32(binary.LittleEndian.Uint32(b[4*i:])))))
	}
	return out, true
}
