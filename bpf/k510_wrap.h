// The 5.10 build's scalar-argument global functions (common/k510.h): the
// lookups they start with, and the wrappers of the functions defined before
// this file (http_genai.h, tls_link.h). The others follow their functions.
#pragma once

#ifdef GT_K510
// The keys live in map memory, not on the wrappers' stacks (the deepest
// chain runs through them): gt_ios' index in read-only data (gt_k510_zero,
// common/k510.h), the connection's key beside io (set where io is filled,
// gt_on_io_target).

static __always_inline struct gt_io *gt_k510_io(void)
{
	struct gt_io_scratch *is = bpf_map_lookup_elem(&gt_ios, (__u32 *)&gt_k510_zero);
	return is ? &is->io : 0;
}

static __always_inline struct gt_conn *gt_k510_conn(struct gt_io *io)
{
	if (!io)
		return 0;
	struct gt_io_scratch *is = (struct gt_io_scratch *)io; // io is its first member
	return bpf_map_lookup_elem(&gt_conns, &is->k510_key);
}

// The rollout scan (gt_scan_rollout, bpf/http.h) without bpf_loop: each
// window of the body (gt_read_window) in steps of eight bytes, each step a
// global function of its index that finds the connection's request (ev is
// always c->req), the scratch and the window's length (gt_k510_win) again.
struct gt_k510_win {
	__u32 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_k510_win);
} gt_k510_win SEC(".maps");

__noinline int gt_k510_rollout_at8(int w)
{
	__u32 zero = 0;
	struct gt_k510_win *win = bpf_map_lookup_elem(&gt_k510_win, &zero);
	struct gt_conn *c = gt_k510_conn(gt_k510_io());
	struct gt_scratch *sc = gt_get_scratch();
	if (!win || !c || !sc)
		return 1;
	__u32 base = (w * 8) & (GT_SCRATCH - 8);
	if (base >= win->n)
		return 0;
	// A key starts at a quote: a word without one costs a load.
	__u64 x = *(__u64 *)&sc->buf[base];
	if (!GT_HAS_BYTE(x, '"'))
		return 0;
	struct gt_rollout_ctx cx = {.sc = sc, .ev = &c->req, .n = win->n};
#pragma unroll
	for (int k = 0; k < 8; k++)
		if (((x >> (8 * k)) & 0xff) == '"')
			gt_rollout_at(base + k, &cx);
	return 0;
}

static __always_inline int gt_k510_scan_rollout(__u64 ubuf, __u32 len)
{
	__u32 zero = 0;
	struct gt_k510_win *win = bpf_map_lookup_elem(&gt_k510_win, &zero);
	struct gt_scratch *sc = gt_get_scratch();
	if (!win || !sc)
		return 0;
	int w;
	gt_for(w, 0, GT_ROLLOUT_WINDOWS)
	{
		__u32 off;
		int got = gt_read_window(sc, ubuf, len, w, GT_ROLLOUT_WINDOWS, GT_ROLLOUT_WINDOWS / 2, &off);
		if (got <= 0)
			break;
		win->n = got;
		// Every word of the scratch, the step past the window's end
		// returning at once: a loop on a constant alone, so the
		// verifier follows one path through it, not two a step.
		int i;
		for (i = 0; i < GT_SCRATCH / 8; i++)
			gt_k510_rollout_at8(i);
	}
	return 0;
}

GT_K510_CI(gt_genai_begin, (__u64 seq, __u64 groups), 0, c, io, seq, groups)
#define gt_genai_begin(c, io, ...) gt_genai_begin_k510(__VA_ARGS__)
GT_K510_CI(gt_genai_end, (__u32 dir), 0, c, io, dir)
#define gt_genai_end(c, io, ...) gt_genai_end_k510(__VA_ARGS__)
// The TLS programs, its other caller, are left out of this build's load.
GT_K510_CI(gt_tls_link_write, (int kind, __u64 a1), 0, io, c, kind, a1)
#define gt_tls_link_write(io, c, ...) gt_tls_link_write_k510(__VA_ARGS__)
#endif
