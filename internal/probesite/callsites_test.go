package probesite

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/gymtrace/gymtrace/test/testproc"
)

const (
	sidRoot    = "/var/tmp/gymtrace-sid"
	trixieRoot = "/var/tmp/gymtrace-trixie"
	copySym    = "PyContext_CopyCurrent"
)

// The builds Gym's runtime and the tests use, read as they are on disk:
// every call of PyContext_CopyCurrent found, each probe on an emulated
// instruction with the context in a register, and the wrappers reached
// through method tables given return probes.
func TestFindCallsDebianBuilds(t *testing.T) {
	for _, c := range []struct {
		path           string
		sites, returns int // sites < 0: at least -sites (the build may move)
	}{
		// uvloop 0.23: 18 calls of its Context_CopyCurrent wrapper, which
		// tail-jumps through the PLT (objdump finds the same 18); sid may
		// bring another uvloop, so at least 10.
		{sidRoot + "/usr/lib/python3/dist-packages/uvloop/loop.cpython-314-x86_64-linux-gnu.so", -10, 0},
		// Task creation and Future.add_done_callback.
		{sidRoot + "/usr/lib/python3.14/lib-dynload/_asyncio.cpython-314-x86_64-linux-gnu.so", 2, 0},
		{trixieRoot + "/usr/lib/python3.13/lib-dynload/_asyncio.cpython-313-x86_64-linux-gnu.so", 2, 0},
		// contextvars.copy_context: a wrapper only its method table reaches.
		{sidRoot + "/usr/bin/python3.14", 0, 1},
		{trixieRoot + "/usr/lib/python3.13/lib-dynload/_contextvars.cpython-313-x86_64-linux-gnu.so", 0, 1},
		{"/usr/lib/python3.11/lib-dynload/_contextvars.cpython-311-x86_64-linux-gnu.so", 0, 1},
		// python-build-standalone 3.14 (clang, LTO, BOLT; test/pbspython):
		// _asyncio built in (Task creation, Future.add_done_callback), and
		// copy_context's wrapper, whose frame pointer set-up entryJump sees
		// through.
		{sidRoot + "/opt/python-build-standalone-3.14/bin/python3.14", 2, 1},
		// The interpreters that call it from no instruction of their own.
		{trixieRoot + "/usr/bin/python3.13", 0, 0},
		{"/usr/bin/python3.11", 0, 0},
	} {
		t.Run(c.path, func(t *testing.T) {
			f := testproc.OpenELF(t, c.path)
			got, err := FindCalls(f, copySym)
			if err != nil {
				t.Fatal(err)
			}
			if (c.sites >= 0 && len(got.Sites) != c.sites) || len(got.Sites) < -c.sites || len(got.Returns) != c.returns {
				t.Fatalf("%d sites and %d return probes (%#x), want %d and %d", len(got.Sites), len(got.Returns), got.Returns, c.sites, c.returns)
			}
			for _, s := range got.Sites {
				code, err := ReadVaddr(f, s.Probe, 16)
				if err != nil || !IsEmulated(code) || s.Probe <= s.Call || s.Probe-s.Call > 64 || family(s.Reg) != s.Reg || s.Reg == x86asm.RSP {
					t.Errorf("site %+v: probe bytes % x (err %v)", s, code, err)
				}
			}
			for _, w := range got.Returns {
				if _, cheap, err := Entry(f, w); err != nil || !cheap {
					t.Errorf("wrapper %#x: entry not emulated (err %v)", w, err)
				}
			}
		})
	}
}

// fn decodes code as a function at 0x1000, with the call target 0x2000.
func fn(t *testing.T, code []byte) (*tracker, *function) {
	t.Helper()
	tr := &tracker{targets: map[uint64]bool{0x2000: true}, slots: map[uint64]bool{}}
	f, err := tr.decode(code, 0x1000)
	if err != nil {
		t.Fatal(err)
	}
	return tr, f
}

// call 0x2000 from 0x1000: e8 + rel32 (0x2000 - 0x1005).
var call = []byte{0xe8, 0xfb, 0x0f, 0x00, 0x00}

func TestAfterCall(t *testing.T) {
	var (
		movRbxRax   = []byte{0x48, 0x89, 0xc3}
		xorEax      = []byte{0x31, 0xc0}
		testRbx     = []byte{0x48, 0x85, 0xdb}
		testRax     = []byte{0x48, 0x85, 0xc0}
		je          = []byte{0x74, 0x10}
		storeRax    = []byte{0x48, 0x89, 0x44, 0x24, 0x08}             // mov %rax,0x8(%rsp)
		storeRbxR15 = []byte{0x49, 0x89, 0x9f, 0x90, 0x00, 0x00, 0x00} // mov %rbx,0x90(%r15)
		storeEaxR15 = []byte{0x41, 0x89, 0x87, 0x90, 0x00, 0x00, 0x00} // mov %eax,0x90(%r15)
		callNext    = []byte{0xe8, 0x00, 0x00, 0x00, 0x00}
		popRbx      = []byte{0x5b}
		ret         = []byte{0xc3}
		jmpTableEnd = []byte{0x3e, 0xff, 0xe0} // notrack jmp *%rax, no table before it
	)
	for _, c := range []struct {
		name   string
		code   []byte
		probe  uint64 // 0: not covered
		reg    x86asm.Reg
		stores []int64
	}{
		{"test and je", cat(call, testRax, je, ret), 0x1008, x86asm.RAX, nil},
		{"moved, then the old register reused", cat(call, movRbxRax, xorEax, testRbx, je, ret), 0x100d, x86asm.RBX, nil},
		{"stored, then another call", cat(call, storeRax, callNext, ret), 0x100a, x86asm.RAX, []int64{8}},
		// Where the caller keeps it: a copy's 64 bits, not a 32-bit part.
		{"moved and stored in a field", cat(call, movRbxRax, storeRbxR15, storeEaxR15, testRbx, je, ret), 0x1019, x86asm.RAX, []int64{0x90}},
		{"popped over", cat(call, popRbx, testRax, je, ret), 0, 0, nil},
		{"overwritten", cat(call, xorEax, je, ret), 0, 0, nil},
		{"a jump through a register", cat(call, testRax, je, ret, jmpTableEnd), 0, 0, nil},
		// jmp back to the test (at 0x1005) from after the je: another path.
		{"a branch into the window", cat(call, testRax, je, []byte{0xeb, 0xf9}), 0, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, f := fn(t, c.code)
			site, err := afterCall(f, 0)
			if c.probe == 0 {
				if !errors.Is(err, ErrNotCovered) {
					t.Fatalf("site %+v, err %v: want ErrNotCovered", site, err)
				}
				return
			}
			if err != nil || site.Probe != c.probe || site.Reg != c.reg || !slices.Equal(site.Stores, c.stores) {
				t.Fatalf("site %+v, err %v: want probe %#x in %v, stores %v", site, err, c.probe, c.reg, c.stores)
			}
		})
	}
}

func TestFamily(t *testing.T) {
	for r, want := range map[x86asm.Reg]x86asm.Reg{
		x86asm.EAX: x86asm.RAX, x86asm.R9L: x86asm.R9, x86asm.BX: x86asm.RBX, x86asm.AH: x86asm.RAX, x86asm.BH: x86asm.RBX,
		x86asm.SIB: x86asm.RSI, x86asm.R15B: x86asm.R15, x86asm.CL: x86asm.RCX, x86asm.R12: x86asm.R12,
	} {
		if got := family(r); got != want {
			t.Errorf("family(%v) = %v, want %v", r, got, want)
		}
	}
}

// storeAfter finds the register that holds the object a caller writes into
// after a call (FindHolderCalls): sid's inlined register_task, and what
// must keep a store from counting.
func TestStoreAfter(t *testing.T) {
	var (
		leaR15     = []byte{0x49, 0x8d, 0x97, 0x98, 0x00, 0x00, 0x00} // lea 0x98(%r15),%rdx
		loadRax    = []byte{0x48, 0x8b, 0x88, 0x78, 0x03, 0x00, 0x00} // mov 0x378(%rax),%rcx
		storeR15   = []byte{0x49, 0x89, 0xb7, 0x98, 0x00, 0x00, 0x00} // mov %rsi,0x98(%r15)
		store32    = []byte{0x41, 0x89, 0xb7, 0x98, 0x00, 0x00, 0x00} // mov %esi,0x98(%r15)
		storeOther = []byte{0x49, 0x89, 0xb7, 0xa0, 0x00, 0x00, 0x00} // mov %rsi,0xa0(%r15)
		storeRdx   = []byte{0x48, 0x89, 0xb2, 0x98, 0x00, 0x00, 0x00} // mov %rsi,0x98(%rdx)
		movR15Rax  = []byte{0x49, 0x89, 0xc7}                         // mov %rax,%r15
		je         = []byte{0x74, 0x10}
		ret        = []byte{0xc3}
	)
	for _, c := range []struct {
		name string
		code []byte
		reg  x86asm.Reg // 0: none
	}{
		{"register_task (sid's Task.__init__)", cat(call, leaR15, loadRax, storeR15, ret), x86asm.R15},
		{"another field only", cat(call, storeOther, ret), 0},
		{"a 32-bit store", cat(call, store32, ret), 0},
		{"through a register the call clobbers", cat(call, storeRdx, ret), 0},
		{"the base written after the call", cat(call, movR15Rax, storeR15, ret), 0},
		{"a branch before the store", cat(call, je, storeR15, ret), 0},
		{"returned before it", cat(call, ret, storeR15), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, f := fn(t, c.code)
			reg, ok := storeAfter(f, 0, 0x98)
			if ok != (c.reg != 0) || reg != c.reg {
				t.Fatalf("got %v, %v; want %v", reg, ok, c.reg)
			}
		})
	}
}

// tlsBefore finds where a build that reads the thread state inline
// (python-build-standalone's Task.__init__, clang with LTO) can probe its
// inlined register_task: the jcc of `if (task_node.next == NULL)`, the
// Task in %rbx until the store into task_node; and what must keep a store
// from counting.
func TestTLSBefore(t *testing.T) {
	var (
		cmpq     = []byte{0x48, 0x83, 0xbb, 0x98, 0x00, 0x00, 0x00, 0x00}       // cmpq $0x0,0x98(%rbx)
		jne      = []byte{0x75, 0x36}                                           // jne (past the registration)
		leaRax   = []byte{0x48, 0x8d, 0x83, 0x98, 0x00, 0x00, 0x00}             // lea 0x98(%rbx),%rax
		tlsRcx   = []byte{0x64, 0x48, 0x8b, 0x0c, 0x25, 0xf8, 0xff, 0xff, 0xff} // mov %fs:0xfffffffffffffff8,%rcx
		leaRdx   = []byte{0x48, 0x8d, 0x91, 0x70, 0x03, 0x00, 0x00}             // lea 0x370(%rcx),%rdx
		loadRsi  = []byte{0x48, 0x8b, 0xb1, 0x78, 0x03, 0x00, 0x00}             // mov 0x378(%rcx),%rsi
		prevRbx  = []byte{0x48, 0x89, 0xb3, 0xa0, 0x00, 0x00, 0x00}             // mov %rsi,0xa0(%rbx)
		storeRbx = []byte{0x48, 0x89, 0x93, 0x98, 0x00, 0x00, 0x00}             // mov %rdx,0x98(%rbx)
		movRbx   = []byte{0x48, 0x89, 0xc3}                                     // mov %rax,%rbx
		ret      = []byte{0xc3}
	)
	pbs := cat(cmpq, jne, leaRax, tlsRcx, leaRdx, loadRsi, prevRbx, storeRbx, ret)
	for _, c := range []struct {
		name  string
		code  []byte
		probe uint64 // 0: none
	}{
		{"register_task (python-build-standalone's Task.__init__)", pbs, 0x1008},
		{"no thread-state read", cat(cmpq, jne, leaRax, leaRdx, loadRsi, prevRbx, storeRbx, ret), 0},
		{"the base written", cat(cmpq, jne, leaRax, tlsRcx, movRbx, storeRbx, ret), 0},
		{"returned before it", cat(cmpq, jne, tlsRcx, ret, storeRbx), 0},
		// jmp back to the lea (at 0x100a) from after the store: another path.
		{"a branch into the stretch", cat(cmpq, jne, leaRax, tlsRcx, leaRdx, loadRsi, prevRbx, storeRbx, []byte{0xeb, 0xd2}), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := &tracker{targets: map[uint64]bool{}, slots: map[uint64]bool{}, keepAll: true}
			f, err := tr.decode(c.code, 0x1000)
			if err != nil || f == nil {
				t.Fatalf("decoding: %v", err)
			}
			var got uint64
			for j, x := range f.insts {
				if base, ok := holderStore(x, 0x98); ok && base == x86asm.RBX {
					if p, ok := tlsBefore(f, j, base); ok {
						got = p.pc
					}
				}
			}
			if got != c.probe {
				t.Fatalf("probe at %#x, want %#x", got, c.probe)
			}
		})
	}
}

// entryJump sees a wrapper through a frame set up and torn down again
// (python-build-standalone's copy_context: push %rbp; mov %rsp,%rbp;
// pop %rbp; jmp PyContext_CopyCurrent).
func TestEntryJump(t *testing.T) {
	jmp := []byte{0xe9, 0x96, 0xc8, 0x01, 0x00}
	for _, c := range []struct {
		name string
		code []byte
		at   uint64 // 0: not a wrapper
	}{
		{"a jump", cat(jmp), 0x1000},
		{"endbr64, a jump", cat([]byte{0xf3, 0x0f, 0x1e, 0xfa}, jmp), 0x1004},
		{"a frame, a jump", cat(framePair, jmp), 0x1005},
		{"a frame kept", cat([]byte{0x55, 0x48, 0x89, 0xe5}, jmp), 0},
		{"a call", cat([]byte{0xe8, 0x96, 0xc8, 0x01, 0x00}), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			j, ok := entryJump(c.code, 0x1000)
			if ok != (c.at != 0) || (ok && j.pc != c.at) {
				t.Fatalf("jump %v at %#x (%v), want at %#x", j.in, j.pc, ok, c.at)
			}
		})
	}
}
