//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// TestVerifyCosts is a diagnostic, not a check: where does a program's
// verified-instruction count go? The verifier checks each global function
// of a program once, on its own, and counts all of them against the
// program's one budget; this loads the program once whole and then once
// per global function, as a program that calls that function alone (the
// other global functions stubbed), and prints the counts over 3000. A
// refusal prints the verifier's last lines (GYMTRACE_VERIFY_LOG=FUNC: its
// last 150).
//
//	sudo GYMTRACE_VERIFY_COSTS=gt_exit_write,gt_inject_enter_write go test -run VerifyCosts -v ./internal/loader
//
// GYMTRACE_BPF_VARIANT picks the build; GYMTRACE_VERIFY_OBJ=FILE loads an
// object of one's own instead (a variant of bpf/gymtrace.c compiled by hand).
// scripts/kernel-matrix's guests run it the same way (go test -c).
func TestVerifyCosts(t *testing.T) {
	progs := os.Getenv("GYMTRACE_VERIFY_COSTS")
	if progs == "" {
		t.Skip("set GYMTRACE_VERIFY_COSTS=PROG,... to see what each global function costs the verifier (needs root)")
	}
	needRoot(t)
	v, _, err := PickVariant()
	if err != nil {
		t.Fatal(err)
	}
	if f := os.Getenv("GYMTRACE_VERIFY_OBJ"); f != "" {
		v = Variant{Name: f, load: func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec(f) }}
	}
	spec, err := v.Spec()
	if err != nil {
		t.Fatal(err)
	}
	logFn := os.Getenv("GYMTRACE_VERIFY_LOG")
	defer func() { verifyLogLevel = ebpf.LogLevelStats }()
	for _, name := range strings.Split(progs, ",") {
		ps := spec.Programs[name]
		if ps == nil {
			t.Fatalf("no program %s in %s", name, v.Name)
		}
		globals := globalFuncs(ps)
		fmt.Printf("%s (%s build):\n", name, v.Name)
		for _, fn := range append([]string{"<whole>"}, globals...) {
			one := spec.Copy()
			if fn != "<whole>" {
				one.Programs[name].Instructions = isolate(one.Programs[name].Instructions, fn, globals)
			}
			vv := Variant{Name: v.Name, load: func() (*ebpf.CollectionSpec, error) { return one, nil }}
			verifyLogLevel = ebpf.LogLevelStats
			if fn == logFn {
				verifyLogLevel |= ebpf.LogLevelBranch
			}
			rep, err := Verify(VerifyOptions{Variant: &vv, Only: func(p string) bool { return p == name }})
			if err != nil {
				t.Fatal(err)
			}
			p := rep.Programs[0]
			refusal := ""
			if p.Err != nil {
				refusal = p.Err.Error()
				var ve *ebpf.VerifierError
				if errors.As(p.Err, &ve) {
					refusal = strings.Join(ve.Log[max(0, len(ve.Log)-4):], " | ")
					if fn == logFn {
						fmt.Println(strings.Join(ve.Log[max(0, len(ve.Log)-150):], "\n"))
					}
				}
			}
			if fn == "<whole>" || p.Verified > 3000 || refusal != "" {
				fmt.Printf("  %-24s %8d insns %8v %.200s\n", fn, p.Verified, p.Took.Round(time.Millisecond), refusal)
			}
		}
	}
}

// globalFuncs are the program's global (non-static) functions other than
// itself: the ones the verifier checks on their own.
func globalFuncs(ps *ebpf.ProgramSpec) []string {
	var out []string
	for _, ins := range ps.Instructions {
		if s := ins.Symbol(); s != "" && s != ps.Name {
			if f := btf.FuncMetadata(&ins); f != nil && f.Linkage == btf.GlobalFunc {
				out = append(out, s)
			}
		}
	}
	return out
}

// isolate makes a program whose main function calls fn alone (with zero
// arguments: a global function is checked for any arguments of its types)
// and whose other global functions return at once.
func isolate(insns asm.Instructions, fn string, globals []string) asm.Instructions {
	first := insns[0]
	m := asm.Mov.Imm(asm.R1, 0).WithSymbol(first.Symbol()).WithSource(first.Source())
	main := asm.Instructions{btf.WithFuncMetadata(m, btf.FuncMetadata(&first))}
	for _, r := range []asm.Register{asm.R2, asm.R3, asm.R4, asm.R5} {
		main = append(main, asm.Mov.Imm(r, 0))
	}
	main = append(main, asm.Call.Label(fn), asm.Mov.Imm(asm.R0, 0), asm.Return())
	var rest asm.Instructions
	in := true
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			in = s == first.Symbol()
		}
		if !in {
			rest = append(rest, ins)
		}
	}
	for _, g := range globals {
		if g != fn {
			rest = stub(rest, g)
		}
	}
	return reachable(append(main, rest...))
}

// stub makes function fn return 0 at once.
func stub(insns asm.Instructions, fn string) asm.Instructions {
	var out asm.Instructions
	in := false
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			in = s == fn
			if in {
				out = append(out, asm.Mov.Imm(asm.R0, 0).WithMetadata(ins.Metadata), asm.Return())
				continue
			}
		}
		if !in {
			out = append(out, ins)
		}
	}
	return out
}

// reachable drops the functions the first one no longer reaches (the
// kernel refuses a program with code nothing calls).
func reachable(insns asm.Instructions) asm.Instructions {
	funcs := map[string]asm.Instructions{}
	var order []string
	cur := ""
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			cur = s
			order = append(order, s)
		}
		funcs[cur] = append(funcs[cur], ins)
	}
	reach := map[string]bool{order[0]: true}
	for todo := []string{order[0]}; len(todo) > 0; todo = todo[1:] {
		for _, ins := range funcs[todo[0]] {
			if r := ins.Reference(); r != "" && funcs[r] != nil && !reach[r] {
				reach[r] = true
				todo = append(todo, r)
			}
		}
	}
	var out asm.Instructions
	for _, f := range order {
		if reach[f] {
			out = append(out, funcs[f]...)
		}
	}
	return out
}
