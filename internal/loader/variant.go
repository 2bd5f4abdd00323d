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
	// Off are the features this build leaves out whatever the kernel
	// (the k510 build's body scans); each is named off like a program
	// the kernel cannot run (Tracer.Off, gymtrace check).
	Off []Unsupported
	// LeftOut are programs this build never loads whole, whatever the
	// kernel: they are stubbed like the optional programs a kernel cannot
	// run, and their features named off.
	LeftOut []Unsupported
	load    func() (*ebpf.CollectionSpec, error)
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
	variantK510    = Variant{Name: "k510", Says: "neither bpf_loop nor global functions with pointer arguments (Linux 5.10 to 5.16)", load: loadBpfk510,
		Off: []Unsupported{
			{Feature: FeatureReward, Needs: "bpf_loop (Linux 5.17+) to walk a /verify response body"},
			{Feature: FeatureGenAI, Needs: "bpf_loop (Linux 5.17+) to walk a model exchange's JSON"},
		},
		// The build's parser functions find their connection and struct
		// gt_io again from the syscall's (bpf/common/k510.h); the TLS
		// return probe has its own, so the TLS programs are left out.
		LeftOut: []Unsupported{
			{Program: "gt_tls_rw_entry", Feature: FeatureTLS, Needs: k510TLS},
			{Program: "gt_tls_rw_ret", Feature: FeatureTLS, Needs: k510TLS},
			{Program: "gt_tls_handshake", Feature: FeatureTLS, Needs: k510TLS},
			{Program: "gt_tls_free", Feature: FeatureTLS, Needs: k510TLS},
		}}
	variants = []Variant{variantIter, variantBounded, variantK510}
)

const k510TLS = "global functions with pointer arguments (Linux 5.13+) for the TLS parser's calls"

// The features a kernel or a build can leave out, as check, the start-up
// log and gymtrace_kernel_feature_off{feature} name them.
const (
	FeatureInject         = "traceparent injection"
	FeatureAsyncioParents = "asyncio parents (Python and uvloop probes)"
	FeatureTLS            = "HTTPS (OpenSSL probes)"
	FeatureRolloutIDs     = "rollout ids from /run bodies"
	FeatureReward         = "/verify rewards"
	FeatureGenAI          = "model names and token counts"
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
// bpf_iter_num_new), the bounded-loop build where it has bpf_loop (5.17+),
// the k510 build elsewhere (5.10: bpf_loop and global functions with
// pointer arguments came later, and the probe for the one stands for both). GYMTRACE_BPF_VARIANT
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
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnLoop); err != nil {
			return variantK510, fmt.Sprintf("the kernel's BTF could not be read, and it has no bpf_loop helper (%v)", err), nil
		}
		return variantBounded, fmt.Sprintf("the kernel's BTF could not be read (%v), so no iterator kfuncs were looked for", err), nil
	}
	if _, err := spec.AnyTypeByName("bpf_iter_num_new"); err != nil {
		if err := features.HaveProgramHelper(ebpf.TracePoint, asm.FnLoop); err != nil {
			return variantK510, fmt.Sprintf("the kernel has no bpf_loop helper (Linux 5.17+): %v", err), nil
		}
		return variantBounded, "the kernel has no bpf_iter_num_new kfunc (open-coded iterators came in Linux 6.4)", nil
	}
	if StackRounding() == 32 {
		// 6.4 to 6.8 (Ubuntu 24.04's 6.8 among them), or no JIT: the
		// iterator build's deepest call chain is 512 bytes with frames
		// rounded to 32, the verifier's limit itself; the bounded build's
		// is 448 (as on 6.1).
		return variantBounded, "the kernel has the bpf_iter_num_* kfuncs, but its verifier rounds stack frames to 32 bytes (before Linux 6.9, or without the JIT), where the iterator build's deepest call chain is 512 bytes, the limit, and the bounded build's 448", nil
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
	{"gt_inject_sockops", FeatureInject, "bpf_get_current_pid_tgid in sock_ops programs (Linux 6.10+)",
		func() error { return features.HaveProgramHelper(ebpf.SockOps, asm.FnGetCurrentPidTgid) }},
	{"gt_inject_msg", FeatureInject, "bpf_get_current_pid_tgid in sk_msg programs",
		func() error { return features.HaveProgramHelper(ebpf.SkMsg, asm.FnGetCurrentPidTgid) }},
	// The uprobe programs that tell their probe sites apart by the attach
	// cookie (Linux 5.15+). Without them the Python probes stay off, and a
	// client call's parent is only what userspace can prove without the
	// kernel's context read (the one request in flight), else none.
	{"gt_py_copy_ret", FeatureAsyncioParents, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	{"gt_py_copy_site", FeatureAsyncioParents, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	{"gt_py_uv_write", FeatureAsyncioParents, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	// The TLS read/write entry probe tells SSL_read from SSL_write by its
	// cookie; the other three are of no use without it.
	{"gt_tls_rw_entry", FeatureTLS, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	{"gt_tls_rw_ret", FeatureTLS, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	{"gt_tls_handshake", FeatureTLS, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
	{"gt_tls_free", FeatureTLS, "uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15+)", haveCookies},
}

func haveCookies() error { return features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie) }

// Unsupported is a program this kernel cannot run and the feature that is
// off for it.
type Unsupported struct {
	Program, Feature, Needs string
}

// stubUnsupported replaces, in spec, the optional programs this kernel
// cannot load with programs that return at once, and says which.
func stubUnsupported(spec *ebpf.CollectionSpec, v Variant) []Unsupported {
	var out []Unsupported
	left := map[string]Unsupported{}
	for _, u := range v.LeftOut {
		left[u.Program] = u
	}
	for _, o := range optional {
		ps := spec.Programs[o.program]
		if ps == nil {
			continue
		}
		if u, ok := left[o.program]; ok {
			o.feature, o.needs = u.Feature, u.Needs
		} else if o.probe() == nil {
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

// offFeatures lists the features off for a build and the programs left out
// of it, each feature once (Program names the first program left out, or is
// empty for a feature the build itself leaves out).
func offFeatures(v Variant, left []Unsupported) []Unsupported {
	var out []Unsupported
	seen := map[string]bool{}
	for _, u := range append(append([]Unsupported(nil), left...), v.Off...) {
		if !seen[u.Feature] {
			seen[u.Feature] = true
			out = append(out, u)
		}
	}
	return out
}
