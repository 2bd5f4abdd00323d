// The 5.10 build's scalar-argument global functions (common/k510.h): the
// lookups they start with, and the wrappers of the functions defined before
// this file (http_genai.h, tls_link.h). The others follow their functions.
#pragma once

#ifdef GT_K510
static __always_inline struct gt_io *gt_k510_io(void)
{
	__u32 zero = 0;
	struct gt_io_scratch *is = bpf_map_lookup_elem(&gt_ios, &zero);
	return is ? &is->io : 0;
}

static __always_inline struct gt_conn *gt_k510_conn(struct gt_io *io)
{
	if (!io)
		return 0;
	struct gt_conn_key key = {.tgid = io->tgid, .fd = io->fd};
	return bpf_map_lookup_elem(&gt_conns, &key);
}

GT_K510_CI(gt_genai_begin, (__u64 seq), 0, c, seq)
#define gt_genai_begin(c, ...) gt_genai_begin_k510(__VA_ARGS__)
GT_K510_CI(gt_genai_end, (__u32 dir), 0, c, io, dir)
#define gt_genai_end(c, io, ...) gt_genai_end_k510(__VA_ARGS__)
// The TLS programs, its other caller, are left out of this build's load.
GT_K510_CI(gt_tls_link_write, (int kind, __u64 a1), 0, io, c, kind, a1)
#define gt_tls_link_write(io, c, ...) gt_tls_link_write_k510(__VA_ARGS__)
#endif
