package probesite

import (
	"debug/elf"
	"os"
	"testing"
)

func TestIsEmulated(t *testing.T) {
	for _, c := range []struct {
		code []byte
		want bool
	}{
		{[]byte{0x55}, true},                          // push %rbp
		{[]byte{0x41, 0x57}, true},                    // push %r15
		{[]byte{0xe8, 0, 0, 0, 0}, true},              // call rel32
		{[]byte{0xe9, 0, 0, 0, 0}, true},              // jmp rel32
		{[]byte{0x74, 0x05}, true},                    // je rel8
		{[]byte{0x0f, 0x84, 0, 0, 0, 0}, true},        // je rel32
		{[]byte{0x66, 0xe9, 0, 0}, false},             // jmpw: single-stepped
		{[]byte{0x48, 0x50}, false},                   // REX.W push: the kernel emulates only 41 50+r
		{[]byte{0x40, 0x55}, false},                   // REX push
		{[]byte{0x48, 0x83, 0xec, 0x18}, false},       // sub $0x18,%rsp
		{[]byte{0x48, 0x85, 0xff}, false},             // test %rdi,%rdi
		{[]byte{0xf3, 0x0f, 0x1e, 0xfa}, false},       // endbr64
		{[]byte{0x48, 0x8b, 0x07}, false},             // mov (%rdi),%rax
		{[]byte{0xc3}, false},                         // ret
		{[]byte{0x64, 0x48, 0x8b, 0x04, 0x25}, false}, // mov %fs:...,%rax
	} {
		if got := IsEmulated(c.code); got != c.want {
			t.Errorf("IsEmulated(% x) = %v, want %v", c.code, got, c.want)
		}
	}
}

var endbr = []byte{0xf3, 0x0f, 0x1e, 0xfa}

// cat joins instruction bytes into one function body.
func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// The return-probe site is the first emulated instruction of the
// straight-line start, and nothing that moves, reads or addresses %rsp,
// and no branch, may come before it.
func TestStraightLineSite(t *testing.T) {
	movFS := []byte{0x64, 0x48, 0x8b, 0x14, 0x25, 0xe8, 0xff, 0xff, 0xff} // mov %fs:-0x18,%rdx
	movD0 := []byte{0x48, 0x8b, 0x82, 0xd0, 0x00, 0x00, 0x00}             // mov 0xd0(%rdx),%rax
	test := []byte{0x48, 0x85, 0xc0}                                      // test %rax,%rax
	je := []byte{0x74, 0x09}                                              // je +9
	for _, c := range []struct {
		name string
		code []byte
		at   uint64
		ok   bool
	}{
		// CPython 3.14's PyContext_CopyCurrent (Debian sid).
		{"py3.14 CopyCurrent", cat(endbr, movFS, movD0, test, je), 4 + 9 + 7 + 3, true},
		{"push first", cat(endbr, []byte{0x53}), 4, true},
		// Each of these comes before an emulated je, which must not be
		// taken: they move, read or address %rsp (some implicitly), or
		// branch.
		{"sub rsp first", cat(endbr, []byte{0x48, 0x83, 0xec, 0x18}, je), 0, false},
		{"write to the stack", cat(endbr, []byte{0x48, 0x89, 0x04, 0x24}, je), 0, false}, // mov %rax,(%rsp)
		{"read rsp", cat(endbr, []byte{0x48, 0x89, 0xe0}, je), 0, false},                 // mov %rsp,%rax
		{"read esp", cat(endbr, []byte{0x89, 0xe0}, je), 0, false},                       // mov %esp,%eax
		{"address esp", cat(endbr, []byte{0x67, 0x8b, 0x04, 0x24}, je), 0, false},        // mov (%esp),%eax
		{"ret first", cat(endbr, []byte{0xc3}, je), 0, false},
		{"pop first", cat(endbr, []byte{0x5b}, je), 0, false},           // pop %rbx
		{"leave first", cat(endbr, []byte{0xc9}, je), 0, false},         // leave
		{"indirect call", cat(endbr, []byte{0xff, 0xd0}, je), 0, false}, // call *%rax
		{"indirect jump", cat(endbr, []byte{0xff, 0xe0}, je), 0, false}, // jmp *%rax
		{"ud2", cat(endbr, []byte{0x0f, 0x0b}, je), 0, false},
		{"undecodable", cat(endbr, []byte{0x06}, je), 0, false},                // push %es: invalid in 64-bit mode
		{"rex push is not emulated", cat(endbr, []byte{0x48, 0x50}), 0, false}, // push %rax with REX.W: single-stepped, and it moves %rsp
		{"runs out", cat(endbr, movFS, movD0), 0, false},
	} {
		at, ok := straightLineSite(c.code, 4)
		if at != c.at || ok != c.ok {
			t.Errorf("%s: site %d, %v; want %d, %v", c.name, at, ok, c.at, c.ok)
		}
	}
}

// A site some branch of the function leads back to (a loop head, a jump to
// the entry) would be hit twice in one call.
func TestBranchesTo(t *testing.T) {
	test := []byte{0x48, 0x85, 0xc0} // test %rax,%rax
	je := []byte{0x74, 0x02}         // je +2 (over the next jmp)
	for _, c := range []struct {
		name string
		code []byte
		want bool
	}{
		// endbr64; test; je +2; jmp <elsewhere>; ret
		{"forward only", cat(endbr, test, je, []byte{0xeb, 0x01}, []byte{0xc3}), false},
		// endbr64; test; je +2; jmp back to the je (offset 7); ret
		{"back to the site", cat(endbr, test, je, []byte{0xeb, 0xfb}, []byte{0xc3}), true},
		// endbr64; test; je +2; jmp back to the entry; ret
		{"back to the entry", cat(endbr, test, je, []byte{0xeb, 0xf5}, []byte{0xc3}), true},
		{"undecodable tail", cat(endbr, test, je, []byte{0x06}), true}, // push %es: invalid in 64-bit mode
	} {
		if got := branchesTo(c.code, 7); got != c.want {
			t.Errorf("%s: branchesTo = %v, want %v", c.name, got, c.want)
		}
	}
}

// On the interpreters the tests run, PyContext_CopyCurrent's return probe
// lands on an emulated instruction: Debian 12's 3.11 and 13's 3.13 at their
// push, sid's 3.14 on the je after three loads.
func TestReturnOnCPython(t *testing.T) {
	for _, c := range []struct {
		path string
		off  uint64
	}{
		{"/usr/bin/python3.11", 0},
		{"/var/tmp/gymtrace-trixie/usr/bin/python3.13", 4},
		{"/var/tmp/gymtrace-sid/usr/bin/python3.14", 0x17},
	} {
		f, err := elf.Open(c.path)
		if err != nil {
			if os.IsNotExist(err) {
				t.Logf("skipping %s: not here (scripts/setup --tests builds the roots)", c.path)
				continue
			}
			t.Fatal(err)
		}
		syms, err := f.DynamicSymbols()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, s := range syms {
			if s.Name != "PyContext_CopyCurrent" {
				continue
			}
			found = true
			off, cheap, err := Return(f, s.Value, s.Size)
			if err != nil || off != c.off || !cheap {
				t.Errorf("%s: Return = %#x, emulated %v, %v; want %#x, emulated", c.path, off, cheap, err, c.off)
			}
		}
		f.Close()
		if !found {
			t.Errorf("%s: no PyContext_CopyCurrent", c.path)
		}
	}
}
