// A question for the running kernel's verifier, asked before the real
// objects load (internal/loader/preempt.go): may a program call a global
// function while it holds preemption off? Kernels 6.10 to 6.1x refuse it
// ("global function calls are not allowed with preemption disabled"), later
// ones allow it. The TLS return probe (bpf/tls.h) calls the parser, whose
// steps are global functions, so it can run whole on its CPU only where the
// answer is yes (bpf/common/preempt.h).
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

extern void bpf_preempt_disable(void) __ksym;
extern void bpf_preempt_enable(void) __ksym;

__noinline int gt_probe_global(int x)
{
	return x & 1;
}

SEC("uprobe")
int gt_probe_pin(void *ctx)
{
	bpf_preempt_disable();
	int r = gt_probe_global(1);
	bpf_preempt_enable();
	return r;
}
