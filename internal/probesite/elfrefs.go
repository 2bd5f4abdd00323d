package probesite

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/arch/x86/x86asm"
)

// What FindCalls reads from an ELF file besides its code: where the
// function is (its symbol, its PLT stubs and GOT slots), whether data holds
// its address, and where functions start.

func (t *tracker) resolve(symbol string) error {
	syms, err := t.f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return err
	}
	idx := -1
	for i, s := range syms {
		if s.Name != symbol {
			continue
		}
		if s.Section != elf.SHN_UNDEF && s.Value != 0 {
			t.targets[s.Value] = true
			t.defined = s.Value
		} else {
			idx = i + 1 // DynamicSymbols leaves out index 0
		}
	}
	// Relocations naming the symbol: GOT slots (PLT or -fno-plt calls), or
	// its address stored in data, which makes it callable from anywhere.
	err = t.eachRela(func(r uint64, typ elf.R_X86_64, sym int, addend uint64) error {
		switch {
		case idx > 0 && sym == idx && (typ == elf.R_X86_64_JMP_SLOT || typ == elf.R_X86_64_GLOB_DAT):
			t.slots[r] = true
		case idx > 0 && sym == idx:
			return fmt.Errorf("%w: relocation %v stores its address", ErrNotCovered, typ)
		case t.defined != 0 && typ == elf.R_X86_64_RELATIVE && addend == t.defined:
			return fmt.Errorf("%w: its address is stored in data", ErrNotCovered)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if t.defined != 0 && t.f.Type == elf.ET_EXEC && t.dataHolds(t.defined) {
		return fmt.Errorf("%w: its address is stored in data", ErrNotCovered)
	}
	return t.pltStubs()
}

// pltStubs adds the PLT entries that jump through one of the slots.
func (t *tracker) pltStubs() error {
	for _, name := range []string{".plt", ".plt.sec", ".plt.got"} {
		s := t.f.Section(name)
		if s == nil || len(t.slots) == 0 {
			continue
		}
		code, err := s.Data()
		if err != nil {
			return err
		}
		for pc := 0; pc < len(code); {
			if IsEndbr64(code[pc:]) {
				pc += 4
				continue
			}
			in, err := x86asm.Decode(code[pc:], 64)
			if err != nil || in.Len == 0 {
				pc++ // padding between entries
				continue
			}
			at := s.Addr + uint64(pc)
			if in.Op == x86asm.JMP && t.slots[ripTarget(in, at)] {
				t.targets[at] = true
				if pc >= 4 && IsEndbr64(code[pc-4:]) {
					t.targets[at-4] = true // IBT stub: calls land on its endbr64
				}
			}
			pc += in.Len
		}
	}
	return nil
}

// dataHolds reports whether an 8-byte-aligned word of f's data (a non-PIE
// executable's function pointers need no relocation) holds v.
func (t *tracker) dataHolds(v uint64) bool {
	for _, s := range t.f.Sections {
		if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_ALLOC == 0 || s.Flags&elf.SHF_EXECINSTR != 0 {
			continue
		}
		switch s.Name {
		case ".eh_frame", ".eh_frame_hdr", ".gcc_except_table", ".interp", ".comment":
			continue
		}
		b, err := s.Data()
		if err != nil {
			return true // unknown: assume the worst
		}
		for off := (8 - int(s.Addr%8)) % 8; off+8 <= len(b); off += 8 {
			if binary.LittleEndian.Uint64(b[off:]) == v {
				return true
			}
		}
	}
	return false
}

// relativeTo: a RELATIVE relocation stores address a (a pointer to it in a
// position-independent file's data). Unreadable relocations say yes.
func (t *tracker) relativeTo(a uint64) bool {
	found := errors.New("found")
	err := t.eachRela(func(_ uint64, typ elf.R_X86_64, _ int, addend uint64) error {
		if typ == elf.R_X86_64_RELATIVE && addend == a {
			return found
		}
		return nil
	})
	return err != nil
}

// eachRela calls do with every Elf64_Rela entry of f (offset, type, symbol
// index, addend) until it returns an error.
func (t *tracker) eachRela(do func(r uint64, typ elf.R_X86_64, sym int, addend uint64) error) error {
	for _, s := range t.f.Sections {
		if s.Type != elf.SHT_RELA {
			continue
		}
		b, err := s.Data()
		if err != nil {
			return err
		}
		for off := 0; off+24 <= len(b); off += 24 {
			info := binary.LittleEndian.Uint64(b[off+8:])
			if err := do(binary.LittleEndian.Uint64(b[off:]), elf.R_X86_64(info&0xffffffff), int(info>>32),
				binary.LittleEndian.Uint64(b[off+16:])); err != nil {
				return err
			}
		}
	}
	return nil
}

// functionStarts reads the sorted function start addresses of f's
// .eh_frame_hdr search table (every function with unwind information: all
// of a GCC or Clang build's).
func functionStarts(f *elf.File) ([]uint64, error) {
	s := f.Section(".eh_frame_hdr")
	if s == nil {
		return nil, errors.New("no .eh_frame_hdr")
	}
	b, err := s.Data()
	if err != nil {
		return nil, err
	}
	// version 1; eh_frame_ptr (any 4-byte encoding); fde_count udata4;
	// table of (initial location, FDE) as datarel sdata4 pairs.
	const udata4, sdata4, datarel = 0x03, 0x0b, 0x30
	if len(b) < 12 || b[0] != 1 || b[1]&0x0f != udata4 && b[1]&0x0f != sdata4 || b[2] != udata4 || b[3] != datarel|sdata4 {
		return nil, fmt.Errorf(".eh_frame_hdr with an encoding not read here (% x)", b[:min(4, len(b))])
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if 12+8*n > len(b) {
		return nil, errors.New(".eh_frame_hdr table cut short")
	}
	out := make([]uint64, 0, n)
	for i := range n {
		loc := int32(binary.LittleEndian.Uint32(b[12+8*i:]))
		out = append(out, uint64(int64(s.Addr)+int64(loc)))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
