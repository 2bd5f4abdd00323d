//go:build linux

package loader

import "fmt"

// pyStatNames names the slots of gt_py_stats (enum gt_py_status in
// bpf/common/python_contract.h) for gymtrace_python_context_total{event}:
// first the outcomes of reading a thread's asyncio context at a syscall,
// then what the context-copy and uvloop write probes did. The rule counters
// (rooted, rooted_read, spawners) say which rule bound request handlers, so
// a run with missing parents shows which one did not fire.
var pyStatNames = map[uint32]string{
	uint32(bpfGtPyStatusGT_PY_OK):          "ok",
	uint32(bpfGtPyStatusGT_PY_NOT_PYTHON):  "not_python",
	uint32(bpfGtPyStatusGT_PY_NO_THREAD):   "no_thread",
	uint32(bpfGtPyStatusGT_PY_NO_CONTEXT):  "no_context",
	uint32(bpfGtPyStatusGT_PY_BAD_CONTEXT): "bad_context",
	uint32(bpfGtPyStatusGT_PY_READ_ERROR):  "read_error",
	uint32(bpfGtPyStatusGT_PY_WALKED):      "walked",
	uint32(bpfGtPyStatusGT_PY_LINKED):      "linked",
	uint32(bpfGtPyStatusGT_PY_ROOTED):      "rooted",
	uint32(bpfGtPyStatusGT_PY_SPAWNERS):    "spawners",
	uint32(bpfGtPyStatusGT_PY_ROOTED_READ): "rooted_read",
	uint32(bpfGtPyStatusGT_PY_UV_WRITES):   "uv_writes",
	uint32(bpfGtPyStatusGT_PY_UV_TAKEN):    "uv_taken",
	uint32(bpfGtPyStatusGT_PY_UV_SKIPPED):  "uv_skipped",
	uint32(bpfGtPyStatusGT_PY_LINKED_SITE): "linked_site",
	uint32(bpfGtPyStatusGT_PY_NOT_TASK):    "not_task",
	uint32(bpfGtPyStatusGT_PY_EAGER):       "eager",
	uint32(bpfGtPyStatusGT_PY_HEAD_MORE):   "head_more",
	uint32(bpfGtPyStatusGT_PY_STALE):       "stale",
}

// pyStatMax is the number of gt_py_stats slots.
const pyStatMax = uint32(bpfGtPyStatusGT_PY_STAT_MAX)

// PyStats sums the per-CPU Python context counters by name.
func (t *Tracer) PyStats() (map[string]uint64, error) {
	sums, err := t.perCPUSums(t.objs.GtPyStats, pyStatMax)
	if err != nil {
		return nil, fmt.Errorf("reading the Python context counters: %w", err)
	}
	out := make(map[string]uint64, len(pyStatNames))
	for i, v := range sums {
		out[pyStatNames[uint32(i)]] = v
	}
	return out, nil
}
