// Open-coded numeric iterators (kernel >= 6.4). The verifier checks one
// iteration and proves convergence instead of unrolling, so a 4 KiB header
// scan costs verification time once, not 4096 times.
#pragma once

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
