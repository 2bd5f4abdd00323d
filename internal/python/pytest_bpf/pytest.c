//go:build ignore

// Test-only BPF object for internal/python: the real bpf/python.h and
// bpf/python_probes.h behind a few tracepoints, so the kernel side can be
// proven on live interpreters before (and independently of) bpf/gymtrace.c.
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "common/contract.h"
#include "common/util.h"
#include "python.h"
#include "python_probes.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Kept in BTF for TestSiteRegContract.
enum gt_py_reg pytest_contract_py_reg __attribute__((unused));
enum gt_py_site_flag pytest_contract_py_site_flag __attribute__((unused));

#define PYTEST_DATA 160

// One record per write/sendto of a process in gt_py_procs: the context the
// kernel read and the first bytes sent (tests take ground truth from them).
struct pytest_event {
	__u64 ctx;
	__u64 root;
	__u64 ns;
	__u32 tgid;
	__u32 tid;
	__s32 status;
	__u32 len;
	__u64 chain[6]; // for failure reports: parent, its parent, ... (live links)
	__u64 chain_root[6];
	__u8 data[PYTEST_DATA];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} pytest_events SEC(".maps");

struct pytest_event unused_pytest_event __attribute__((unused));
struct gt_py_params unused_py_params __attribute__((unused));
struct gt_py_link unused_py_link __attribute__((unused));
struct gt_py_thread unused_py_thread __attribute__((unused));
enum gt_py_status unused_py_status __attribute__((unused));

// Stand-in for http.h's per-connection state: the context that wrote the
// last response bytes on a server connection, keyed by tgid << 32 | fd.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} pytest_last_resp SEC(".maps");

static __always_inline int emit(int fd, const void *buf, __u64 count)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (!bpf_map_lookup_elem(&gt_py_procs, &tgid))
		return 0;
	struct pytest_event *e = bpf_ringbuf_reserve(&pytest_events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->tgid = tgid;
	e->tid = (__u32)pid_tgid;
	e->ns = bpf_ktime_get_ns();
	e->status = gt_py_context(tgid, e->tid, &e->ctx, &e->root);
	e->len = count;
	char head[9] = {};
	if (e->status == GT_PY_OK && !bpf_probe_read_user(head, sizeof(head), buf) &&
	    !__builtin_memcmp(head, "HTTP/1.1 ", 9)) {
		__u64 key = (__u64)tgid << 32 | (__u32)fd;
		bpf_map_update_elem(&pytest_last_resp, &key, &e->ctx, BPF_ANY);
	}
	__u64 a = e->ctx;
	for (int i = 0; i < 6; i++) {
		struct gt_py_link *l;
		gt_py_ctx_id(a, &l);
		e->chain[i] = l && (__u16)(a >> GT_PY_GEN_SHIFT) == l->gen ? l->parent : 0;
		e->chain_root[i] = l && (__u16)(a >> GT_PY_GEN_SHIFT) == l->gen ? l->root : 0;
		a = e->chain[i];
	}
	__u32 n = count;
	if (n > PYTEST_DATA)
		n = PYTEST_DATA;
	if (bpf_probe_read_user(e->data, n, buf))
		e->len = 0;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_write")
int pytest_write(struct trace_event_raw_sys_enter *ctx)
{
	return emit(ctx->args[0], (const void *)ctx->args[1], ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int pytest_sendto(struct trace_event_raw_sys_enter *ctx)
{
	return emit(ctx->args[0], (const void *)ctx->args[1], ctx->args[2]);
}

// A stand-in for http.h's server side: a recvfrom whose data starts with
// "GET /run/" is an inbound request; the context reading it, and the one that
// wrote the previous response on the connection, are spawners.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64[2]); // buf, fd
} pytest_recv_buf SEC(".maps");

SEC("tracepoint/syscalls/sys_enter_recvfrom")
int pytest_recv_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (!bpf_map_lookup_elem(&gt_py_procs, &tgid))
		return 0;
	__u64 v[2] = {ctx->args[1], ctx->args[0]};
	bpf_map_update_elem(&pytest_recv_buf, &tid, v, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_recvfrom")
int pytest_recv_exit(struct trace_event_raw_sys_exit *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	__u64 *buf = bpf_map_lookup_elem(&pytest_recv_buf, &tid);
	if (!buf)
		return 0;
	__u64 b = buf[0], fd = buf[1];
	bpf_map_delete_elem(&pytest_recv_buf, &tid);
	if (ctx->ret < 9)
		return 0;
	char head[9] = {};
	if (bpf_probe_read_user(head, sizeof(head), (const void *)b))
		return 0;
	if (__builtin_memcmp(head, "GET /run/", 9))
		return 0;
	// The connection's id: its fd + 1 (a real one is never 0).
	__u64 conn_id = (__u64)(__u32)fd + 1;
	__u64 c, root;
	if (gt_py_context(tgid, tid, &c, &root) == GT_PY_OK)
		gt_py_mark_spawner(c, tgid, (__s32)fd, conn_id, 1);
	// A server may start this request's task later, from the step that
	// finishes the previous response on the connection (uvicorn does when the
	// request arrived while that response was still being sent).
	__u64 key = (__u64)tgid << 32 | (__u32)fd;
	__u64 *prev = bpf_map_lookup_elem(&pytest_last_resp, &key);
	if (prev)
		gt_py_mark_spawner(*prev, tgid, (__s32)fd, conn_id, 0);
	return 0;
}

// Cost programs, both on sys_enter_getppid: bpf_stats run_time_ns of the
// second minus the first is the price of gt_py_context alone.
__u64 pytest_sink[2];

SEC("tracepoint/syscalls/sys_enter_getppid")
int pytest_cost_base(void *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&gt_py_procs, &tgid))
		return 0;
	pytest_sink[0]++;
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_getppid")
int pytest_cost_ctx(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 c, root;
	gt_py_context(pid_tgid >> 32, (__u32)pid_tgid, &c, &root);
	pytest_sink[1] += c;
	return 0;
}
