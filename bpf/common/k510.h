// The third build of this one source, for Linux 5.10 (Debian 11; the kernel
// family of Amazon Linux 2): -DGT_K510 on top of the bounded-loop build's
// flags (scripts/gen-bpf, internal/loader/gen.go; variant.go picks it where
// the kernel has no bpf_loop). Everything here is macros: without GT_K510
// they expand to exactly what the other two builds always had, so their
// objects stay byte-identical.
//
// What 5.10 lacks, and what this build does instead:
// - global functions with pointer arguments (5.13's "Arg#0 type PTR ... is
//   not supported yet"): GT_GLOBAL functions are static there, verified in
//   each caller's context;
// - bpf_loop (5.17): the header scan (bpf/http.h) and the rollout scan
//   (bpf/k510_wrap.h) are plain loops whose steps are global functions of
//   their index; the /verify reward and the model exchange's JSON walk are
//   left out, and the loader names them off (variant.go, variantK510.Off).
//   gt_loop (common/iter.h) is a plain loop of at most GT_K510_LOOP_MAX
//   steps for what is left;
// - bpf_get_current_task_btf (5.11) and bpf_task_pt_regs (5.15): the
//   syscall arguments are read from the task's stack (io.h);
// - uprobe attach cookies (5.15): the loader leaves the programs that read
//   them out (variant.go, optional).
#pragma once

#ifdef GT_K510
#define GT_GLOBAL static __always_inline
// Index 0 of the build's per-CPU maps, as a key in read-only data: a
// lookup then needs no stack slot for its key.
volatile const __u32 gt_k510_zero = 0;
// The rollout scan of the 5.10 build (bpf/k510_wrap.h), called from
// gt_scan_rollout (bpf/http.h), which comes first.
static inline __attribute__((always_inline)) int gt_k510_scan_rollout(__u64 ubuf, __u32 len);
// Steps of a gt_loop the 5.10 verifier follows one by one: the header
// scan's 8-byte words (GT_K510_LOOP_MAX * 8 bytes of a header block) and
// its lines.
#define GT_K510_LOOP_MAX 64
#else
#define GT_GLOBAL __noinline
#endif

// 5.10 verifies global functions on their own, once, but takes only scalars
// (and the program's context) as their arguments; a static function is
// verified again at every call, in every state its caller reaches it in,
// which took the syscall programs past the 1M-instruction limit. So the
// 5.10 build keeps the chain of the parser global, with scalar arguments:
// after each function F(c, io, ...) comes
//
//	GT_K510_CI(F, (scalar params), miss, c, io, args...)
//	#define F(c, io, ...) F_k510(__VA_ARGS__)   (under GT_K510)
//
// F_k510 finds io (the CPU's gt_ios entry) and c (io's gt_conns entry,
// which is the only c the syscall programs ever pass) again and calls F,
// verified there once; the calls after it go to F_k510. miss is what F_k510
// returns if c has gone from gt_conns meanwhile (another CPU closed it):
// the caller's "stop here". GT_K510_I finds io alone; GT_K510_S the CPU's
// scratch (sc). Without GT_K510 they are empty.
#ifdef GT_K510
#define GT_K510_CI(name, params, miss, ...)              \
	__noinline int name##_k510 params                \
	{                                                \
		struct gt_io *io = gt_k510_io();         \
		struct gt_conn *c = gt_k510_conn(io);    \
		if (!io || !c)                           \
			return (miss);                   \
		return name(__VA_ARGS__);                \
	}
#define GT_K510_I(name, params, miss, ...)               \
	__noinline int name##_k510 params                \
	{                                                \
		struct gt_io *io = gt_k510_io();         \
		if (!io)                                 \
			return (miss);                   \
		return name(__VA_ARGS__);                \
	}
#define GT_K510_S(name, params, miss, ...)               \
	__noinline int name##_k510 params                \
	{                                                \
		struct gt_scratch *sc = gt_get_scratch(); \
		if (!sc)                                 \
			return (miss);                   \
		return name(__VA_ARGS__);                \
	}
#else
#define GT_K510_CI(...)
#define GT_K510_I(...)
#define GT_K510_S(...)
#endif
