//go:build linux

package probesite

import (
	"debug/elf"
	"os"
	"os/exec"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// uprobeSpec is a collection with one empty uprobe program, as the BPF
// objects declare theirs (section "uprobe").
func uprobeSpec() *ebpf.CollectionSpec {
	return &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"p": {
		Name: "p", Type: ebpf.Kprobe, SectionName: "uprobe", License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()},
	}}}
}

func loadProg(t *testing.T, spec *ebpf.CollectionSpec) *ebpf.Program {
	t.Helper()
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	return coll.Programs["p"]
}

// Attach puts every probe of a set in one uprobe_multi link when the
// program was prepared for it (one detach for all), and falls back to a
// link each for a program loaded without PrepareMulti.
func TestAttachGroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF and attaches uprobes")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	// A process that maps the library and never calls the probed functions.
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	const lib = "/lib/x86_64-linux-gnu/libc.so.6"
	f, err := elf.Open(lib)
	if err != nil {
		t.Skipf("no %s: %v", lib, err)
	}
	syms, err := f.DynamicSymbols()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var specs []Spec
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 && s.Size > 0 && len(specs) < 12 {
			specs = append(specs, Spec{Symbol: s.Name, Cookie: uint64(len(specs))})
		}
	}
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		t.Fatal(err)
	}
	attach := func(prog *ebpf.Program, ret bool) int {
		t.Helper()
		ls, err := Attach(ex, prog, cmd.Process.Pid, ret, specs)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if err := l.Close(); err != nil {
				t.Error(err)
			}
		}
		return len(ls)
	}

	classicProg := loadProg(t, uprobeSpec())
	for _, ret := range []bool{false, true} {
		if n := attach(classicProg, ret); n != len(specs) {
			t.Errorf("a program loaded without PrepareMulti (ret %v): %d links for %d probes, want one each", ret, n, len(specs))
		}
	}
	if !MultiWanted() {
		t.Skip("no uprobe_multi here (or before 6.11): every probe is its own link")
	}
	spec := uprobeSpec()
	PrepareMulti(spec)
	if at := spec.Programs["p"].AttachType; at != ebpf.AttachTraceUprobeMulti {
		t.Fatalf("PrepareMulti left the uprobe program's attach type at %v", at)
	}
	multiProg := loadProg(t, spec)
	for _, ret := range []bool{false, true} {
		if n := attach(multiProg, ret); n != 1 {
			t.Errorf("a prepared program (ret %v): %d links for %d probes, want 1", ret, n, len(specs))
		}
	}
}
