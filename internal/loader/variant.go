//go:build linux

package loader

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
)

// Variant is one build of bpf/gymtrace.c (scripts/gen-bpf builds them all
// from the one source).
type Variant struct {
	Name string // "iter", ...
	Says string // what it needs of the kernel, in words
	load func() (*ebpf.CollectionSpec, error)
}

// Spec reads the variant's embedded object.
func (v Variant) Spec() (*ebpf.CollectionSpec, error) {
	spec, err := v.load()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded BPF objects (%s): %w", v.Name, err)
	}
	return spec, nil
}

var (
	variantIter    = Variant{Name: "iter", Says: "open-coded iterators (bpf_iter_num_*, Linux 6.4+)", load: loadBpf}
	variantBounded = Variant{Name: "bounded", Says: "bounded loops (Linux 5.3+)", load: loadBpfbounded}
	variants       = []Variant{variantIter, variantBounded}
)

// VariantByName returns the variant called name.
func VariantByName(name string) (Variant, error) {
	for _, v := range variants {
		if v.Name == name {
			return v, nil
		}
	}
	return Variant{}, fmt.Errorf("no BPF variant %q", name)
}

// Variants lists every variant, the preferred first.
func Variants() []Variant { return append([]Variant(nil), variants...) }

// PickVariant returns the variant this kernel can load, and why: the
// iterator build where the kernel has the iterator kfuncs (its BTF names
// bpf_iter_num_new), the bounded-loop build elsewhere. GYMTRACE_BPF_VARIANT
// names one instead (tests, and the kernel matrix's comparisons).
func PickVariant() (Variant, string, error) {
	if name := os.Getenv("GYMTRACE_BPF_VARIANT"); name != "" {
		v, err := VariantByName(name)
		if err != nil {
			return Variant{}, "", fmt.Errorf("GYMTRACE_BPF_VARIANT: %w", err)
		}
		return v, "GYMTRACE_BPF_VARIANT=" + name, nil
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return variantBounded, fmt.Sprintf("the kernel's BTF could not be read (%v), so no iterator kfuncs were looked for", err), nil
	}
	if _, err := spec.AnyTypeByName("bpf_iter_num_new"); err != nil {
		return variantBounded, "the kernel has no bpf_iter_num_new kfunc (open-coded iterators came in Linux 6.4)", nil
	}
	return variantIter, "the kernel has the bpf_iter_num_* kfuncs", nil
}

// optional are the programs of features gymtrace runs without, with the
// kernel support they need: where a probe says this kernel lacks it, the
// program is loaded as one that does nothing (and never attached), and the
// feature reports itself off (Tracer.Unavailable).
var optional = []struct {
	program, feature, needs string
	probe                   func() error
}{
	{"gt_inject_sockops", "traceparent injection", "bpf_get_current_pid_tgid in sock_ops programs (Linux 6.10+)",
		func() error { return features.HaveProgramHelper(ebpf.SockOps, asm.FnGetCurrentPidTgid) }},
	{"gt_inject_msg", "traceparent injection", "bpf_get_current_pid_tgid in sk_msg programs",
		func() error { return features.HaveProgramHelper(ebpf.SkMsg, asm.FnGetCurrentPidTgid) }},
}

// Unsupported is a program this kernel cannot run and the feature that is
// off for it.
type Unsupported struct {
	Program, Feature, Needs string
}

// stubUnsupported replaces, in spec, the optional programs this kernel
// cannot load with programs that return at once, and says which.
func stubUnsupported(spec *ebpf.CollectionSpec) []Unsupported {
	var out []Unsupported
	for _, o := range optional {
		ps := spec.Programs[o.program]
		if ps == nil || o.probe() == nil {
			continue
		}
		ret := int64(0)
		if ps.Type == ebpf.SockOps || ps.Type == ebpf.SkMsg {
			ret = 1 // SK_PASS; sock_ops ignores it
		}
		ps.Instructions = asm.Instructions{asm.Mov.Imm(asm.R0, int32(ret)).WithSymbol(o.program), asm.Return()}
		out = append(out, Unsupported{Program: o.program, Feature: o.feature, Needs: o.needs})
	}
	return out
}
