// Loops the verifier can follow, in the two builds scripts/gen-bpf makes of
// this one source (internal/loader picks one at load).
//
// The default build uses open-coded numeric iterators (kernel >= 6.4): the
// verifier checks one iteration and proves convergence instead of
// unrolling, so a 4 KiB header scan costs verification time once, not 4096
// times.
//
// GT_BOUNDED_LOOPS (the second object, for kernels without the iterator
// kfuncs) makes gt_for a plain bounded loop, which the verifier (5.3+)
// follows iteration by iteration: a gt_for loop must stay short (tens of
// iterations, or a few hundred of a small body). The scans of a whole
// buffer are gt_loops (below).
#pragma once

#ifdef GT_BOUNDED_LOOPS
// The empty asm is what the iterator's kfunc call is in the other build: a
// point where the compiler must store what the loop keeps in map memory and
// load it again, so the verifier does not carry it in registers, a state
// per value, from one iteration to the next.
#define gt_for(i, start, end) for ((i) = (start); (i) < (end) && ({ asm volatile("" ::: "memory"); 1; }); (i)++)
#else
struct bpf_iter_num {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

extern int bpf_iter_num_new(struct bpf_iter_num *it, int start, int end) __weak __ksym;
extern int *bpf_iter_num_next(struct bpf_iter_num *it) __weak __ksym;
extern void bpf_iter_num_destroy(struct bpf_iter_num *it) __weak __ksym;

#define gt_for(i, start, end)                                                            \
	for (struct bpf_iter_num ___it __attribute__((aligned(8), cleanup(bpf_iter_num_destroy))), \
	     *___p __attribute__((unused)) = (bpf_iter_num_new(&___it, (start), (end)),          \
					      (void)bpf_iter_num_destroy, (void *)0);            \
	     ({                                                                                  \
		     int *___t = bpf_iter_num_next(&___it);                                      \
		     (___t && ((i) = *___t, (i) >= (start) && (i) < (end)));                     \
	     });)
#endif

// gt_loop(n, fn, ctx) calls fn(i, ctx) for i = 0, 1, ..., n - 1 until fn
// returns 1 (0 goes on: fn's `return 0` is a loop's continue, `return 1` its
// break), with bpf_loop (5.17+): the verifier checks fn once (or, from 6.8,
// until its states converge) instead of once per iteration. The scans of a
// whole buffer are gt_loops in both builds: as open-coded iterators, 6.12's
// verifier took 300,000 instructions to converge on the header scan alone.
// fn is defined with GT_LOOP_FN; ctx points to the caller's stack. fn must
// not rely on i being below n: the verifier does not know that of a
// callback's index.
#define GT_LOOP_FN static __noinline long
#ifdef GT_K510
// 5.10 has no bpf_loop: a plain loop of at most GT_K510_LOOP_MAX steps
// (common/k510.h), each a call the verifier follows.
#define gt_loop(n, fn, ctx)                                                   \
	({                                                                    \
		int ___n = (n), ___i;                                         \
		for (___i = 0; ___i < ___n && ___i < GT_K510_LOOP_MAX; ___i++) \
			if (fn(___i, (ctx)))                                  \
				break;                                        \
		0;                                                            \
	})
#else
#define gt_loop(n, fn, ctx) bpf_loop((n), (fn), (ctx), 0)
#endif
