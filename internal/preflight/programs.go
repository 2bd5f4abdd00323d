//go:build linux

package preflight

import (
	"fmt"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// programs loads gymtrace's own BPF programs, the build this kernel gets,
// every one of them through the verifier, none attached: the probes above
// say the kernel has the parts, this says the verifier accepts the whole.
// A refused program is a row of its own: which, why and what to do.
func (c *checker) programs() {
	if !c.o.LoadPrograms {
		return
	}
	v, why, err := loader.PickVariant()
	if err != nil {
		c.add(Result{Feature: "BPF programs", Status: StatusMissing, Need: NeedRequired, Detail: err.Error(),
			Fix: "unset GYMTRACE_BPF_VARIANT, or set it to iter, bounded or k510"})
		return
	}
	feature := "BPF programs (" + v.Name + " build)"
	rep, err := loader.Verify(loader.VerifyOptions{Variant: &v})
	if err != nil {
		r := Result{Feature: feature, Status: StatusMissing, Need: NeedRequired, Detail: err.Error(),
			Fix: "the programs could not be loaded at all; see the rows above"}
		if f := c.bpfFix(); f != "" {
			r.Fix = f
		}
		c.add(r)
		return
	}
	failed := rep.Failed()
	r := Result{Feature: feature, Need: NeedRequired}
	if len(failed) == 0 {
		n, np := rep.MaxVerified()
		s, sp := rep.MaxStack()
		r.Status = StatusOK
		r.Detail = fmt.Sprintf("%d programs loaded and verified (%s): at most %d instructions verified (%s, %.0f%% of the verifier's %d), at most %d bytes of stack (%s)",
			len(rep.Programs), why, n, np, 100*float64(n)/loader.VerifiedLimit, loader.VerifiedLimit, s, sp)
	} else {
		r.Status = StatusMissing
		r.Detail = fmt.Sprintf("the verifier refused %d of %d programs (%s); the rows below say which and why", len(failed), len(rep.Programs), why)
		r.Fix = "gymtrace cannot run on this kernel until they load"
	}
	c.add(r)
	for _, p := range failed {
		c.add(Result{Feature: "program " + p.Name, Status: StatusMissing, Need: NeedRequired, Detail: p.Refusal(), Fix: p.Fix()})
	}
	for _, u := range rep.Unsupported {
		c.add(Result{Feature: "program " + u.Program, Status: StatusMissing, Need: NeedOptional,
			Detail: "this kernel lacks " + u.Needs + ": " + u.Feature + " is off (the program is left out)",
			Fix:    "a newer kernel has it"})
	}
	for _, u := range v.Off {
		c.add(Result{Feature: u.Feature, Status: StatusMissing, Need: NeedOptional,
			Detail: "off in the " + v.Name + " build: this kernel lacks " + u.Needs,
			Fix:    "a newer kernel has it"})
	}
	c.add(preemptionResult(rep.Preemption))
	c.add(syscallPreemptionResult(rep.Preemption))
}

// syscallPreemptionResult says whether the syscall programs run whole on
// their CPU here (bpf/common/preempt.h, gt_sys_pin).
func syscallPreemptionResult(p loader.Preemption) Result {
	r := Result{Feature: "syscall programs kept whole", Need: NeedOptional, Status: StatusOK}
	switch {
	case !p.Preempts:
		r.Detail = "the kernel does not preempt them (" + p.Mode + ")"
	case !p.SyscallsFaultable:
		r.Detail = "the kernel runs them with preemption off"
	case p.SyscallsUnsafe() != "":
		r.Status = StatusMissing
		r.Detail = p.SyscallsUnsafe()
		r.Fix = "boot with preempt=voluntary (PREEMPT_DYNAMIC kernels), or a kernel whose verifier allows global calls with preemption off"
	default:
		r.Detail = "the kernel runs them preemptible (trace_call_bpf_faultable; " + p.Mode + "); they hold preemption off with bpf_preempt_disable, " +
			"and each has an understudy for the runs the kernel skips while one is stopped around them (gymtrace_kernel_events_total{reason=\"program_stood_in\"})"
	}
	return r
}

// preemptionResult says whether the uprobe programs run whole on their CPU
// here (bpf/common/preempt.h), and what stays off where they cannot.
func preemptionResult(p loader.Preemption) Result {
	r := Result{Feature: "uprobe programs kept whole", Need: NeedOptional, Status: StatusOK}
	switch {
	case !p.Preempts:
		r.Detail = "the kernel does not preempt them (" + p.Mode + ")"
	case p.PythonUnsafe() != "":
		r.Status = StatusMissing
		r.Detail = p.PythonUnsafe() + "; " + p.TLSUnsafe()
		r.Fix = "boot with preempt=voluntary (PREEMPT_DYNAMIC kernels), or run Linux 6.10+"
	case p.TLSUnsafe() != "":
		r.Status = StatusMissing
		r.Detail = "the Python probes hold preemption off (" + p.Mode + "); " + p.TLSUnsafe()
		r.Fix = "boot with preempt=voluntary (PREEMPT_DYNAMIC kernels), or a kernel whose verifier allows global calls with preemption off"
	default:
		r.Detail = "the kernel preempts (" + p.Mode + "); every uprobe program holds preemption off with bpf_preempt_disable"
	}
	return r
}
