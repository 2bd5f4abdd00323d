// The uvloop write probe: an entry uprobe on UVStream.write and
// UVStream.writelines of uvloop's extension module, attached per process by
// internal/python ((*UVloopModule).AttachWriteProbes) where uvloop defers
// writes (0.17-0.22.1).
//
// Why: those builds only append a small buffer in write(); the loop's check
// handle flushes it later with write(2)/writev(2), in no task's context, so
// the syscall cannot name the task that wrote. Here, inside the task's step
// with the GIL held, tstate->context is that task's. The flush does not copy:
// a bytes object goes out from PyBytes_AS_STRING (object + 32), anything
// else from the buffer of the memoryview uvloop casts it to. So the record is
// keyed by that data address, and the syscall that starts an HTTP message at
// that address takes it (gt_py_context_w).
//
// The methods' calling convention comes with the attach cookie (Go's
// python.UVloopSite.Cookie): METH_O (uvloop 0.17: the buffer is the second
// argument) or METH_FASTCALL (Cython 3, 0.21: args[0]); writelines takes the
// first element of a list or tuple. One hit per transport write; the program
// is about as cheap as the copy probe's (a cached thread-state lookup and a
// few user reads).
#pragma once

#include "python.h"
#include "common/preempt.h"

#define GT_UV_CONV_O 1
#define GT_UV_CONV_FASTCALL 2
#define GT_UV_CONV_MASK 0xff
#define GT_UV_WRITELINES 0x100

// CPython object layouts used here, stable on 64-bit builds 3.11-3.14
// (offsets from the object's address).
#define GT_PYVAR_SIZE 16       // PyVarObject.ob_size
#define GT_PYLIST_ITEMS 24     // PyListObject.ob_item (a pointer to the array)
#define GT_PYTUPLE_ITEMS 24    // PyTupleObject.ob_item (the array itself)
#define GT_PYBYTES_DATA 32     // PyBytesObject.ob_sval
#define GT_PYBYTEARRAY_START 40 // PyByteArrayObject.ob_start
#define GT_PYMEMVIEW_BUF 56    // PyMemoryViewObject.view.buf

struct pt_regs___gtuv {
#if defined(__TARGET_ARCH_x86)
	unsigned long si;
	unsigned long dx;
#elif defined(__TARGET_ARCH_arm64)
	unsigned long regs[31];
#endif
} __attribute__((preserve_access_index));

static __always_inline void gt_uv_args(void *ctx, __u64 *a1, __u64 *a2)
{
	struct pt_regs___gtuv *r = ctx;
#if defined(__TARGET_ARCH_x86)
	*a1 = r->si;
	*a2 = r->dx;
#elif defined(__TARGET_ARCH_arm64)
	*a1 = r->regs[1];
	*a2 = r->regs[2];
#else
	*a1 = 0;
	*a2 = 0;
#endif
}

// The data address of buffer object obj as uvloop's flush passes it, or 0.
static __always_inline __u64 gt_uv_data(const struct gt_py_params *p, __u64 obj)
{
	if (!obj)
		return 0;
	__u64 type = gt_py_read_u64(obj + p->ob_type);
	if (!type)
		return 0;
	if (type == p->bytes_type)
		return obj + GT_PYBYTES_DATA;
	if (type == p->bytearray_type)
		return gt_py_read_u64(obj + GT_PYBYTEARRAY_START);
	if (type == p->memoryview_type)
		return gt_py_read_u64(obj + GT_PYMEMVIEW_BUF);
	return 0;
}

static __always_inline void gt_py_uv_write_run(void *ctx);

// Runs whole on its CPU (common/preempt.h).
SEC("uprobe/uvloop_write")
int gt_py_uv_write(void *ctx)
{
	gt_own_stack(ctx);
	gt_preempt_off();
	gt_py_uv_write_run(ctx);
	gt_preempt_on();
	return 0;
}

static __always_inline void gt_py_uv_write_run(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	const struct gt_py_params *p = bpf_map_lookup_elem(&gt_py_procs, &tgid);
	if (!p)
		return;
	__u64 t0 = gt_prof_begin();
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 a1, a2, obj = 0;
	gt_uv_args(ctx, &a1, &a2);
	switch (cookie & GT_UV_CONV_MASK) {
	case GT_UV_CONV_O:
		obj = a1;
		break;
	case GT_UV_CONV_FASTCALL:
		// (self, PyObject *const *args, size_t nargsf, kwnames): nargsf
		// may carry PY_VECTORCALL_ARGUMENTS_OFFSET in its top bit.
		if ((a2 & ~(1ULL << 63)) >= 1)
			obj = gt_py_read_u64(a1);
		break;
	}
	if (obj && (cookie & GT_UV_WRITELINES)) {
		__u64 type = gt_py_read_u64(obj + p->ob_type);
		__u64 n = gt_py_read_u64(obj + GT_PYVAR_SIZE);
		if (!n || !type)
			obj = 0;
		else if (type == p->list_type)
			obj = gt_py_read_u64(gt_py_read_u64(obj + GT_PYLIST_ITEMS));
		else if (type == p->tuple_type)
			obj = gt_py_read_u64(obj + GT_PYTUPLE_ITEMS);
		else
			obj = 0; // another iterable: its first buffer is not reachable here
	}
	__u64 addr = gt_uv_data(p, obj);
	if (!addr) {
		gt_py_stat(GT_PY_UV_SKIPPED);
		return;
	}
	__u64 ts = gt_py_tstate(p, tgid, tid);
	if (!ts)
		return;
	__u64 c = gt_py_read_u64(ts + p->tstate_context) & GT_PY_ADDR_MASK;
	struct gt_py_link *l;
	struct gt_py_wbuf w = {.ns = bpf_ktime_get_ns()};
	w.ctx = gt_py_known_id(p, ts, c, &l);
	w.root = l ? l->root : 0;
	struct gt_py_wbuf_key k = {.tgid = tgid, .addr = addr};
	bpf_map_update_elem(&gt_py_wbufs, &k, &w, BPF_ANY);
	gt_py_stat(GT_PY_UV_WRITES);
	gt_prof_end(GT_PROF_PY_UVWRITE, t0);
}
