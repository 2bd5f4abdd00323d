package python

import (
	"encoding/binary"
	"fmt"
	"os"
)

// Thread is one PyThreadState as the kernel's walk sees it.
type Thread struct {
	TState      uint64 // PyThreadState address
	NativeTID   uint64 // thread id in the process's PID namespace
	Context     uint64 // tstate->context (PyContext address), 0 if none yet
	ContextOK   bool   // Context's ob_type is PyContext_Type
	ContextPrev uint64 // Context->ctx_prev when ContextOK
}

// Walk reads pid's interpreter and thread lists through /proc/PID/mem,
// exactly as bpf/python.h does (same offsets, same bounds), so tests can
// compare the kernel's answers with it and Inspect can prove a layout.
func Walk(pid int, p Params) ([]Thread, error) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, fmt.Errorf("opening the memory of process %d: %w", pid, err)
	}
	defer mem.Close()
	return walk(mem, p)
}

// Same bounds as GT_PY_MAX_INTERPS and GT_PY_MAX_THREADS.
const (
	maxInterps = 2
	maxThreads = 32
)

func walk(mem *os.File, p Params) ([]Thread, error) {
	read := func(addr uint64) (uint64, error) {
		var b [8]byte
		if _, err := mem.ReadAt(b[:], int64(addr)); err != nil {
			return 0, fmt.Errorf("reading target memory at %#x: %w", addr, err)
		}
		return binary.LittleEndian.Uint64(b[:]), nil
	}
	var out []Thread
	interp, err := read(p.Runtime + uint64(p.RuntimeInterpHead))
	if err != nil {
		return nil, err
	}
	for i := 0; i < maxInterps && interp != 0; i++ {
		ts, err := read(interp + uint64(p.InterpThreadsHead))
		if err != nil {
			return nil, err
		}
		for j := 0; j < maxThreads && ts != 0; j++ {
			t := Thread{TState: ts}
			if t.NativeTID, err = read(ts + uint64(p.TstateNativeTid)); err != nil {
				return nil, err
			}
			if t.Context, err = read(ts + uint64(p.TstateContext)); err != nil {
				return nil, err
			}
			if t.Context != 0 {
				if typ, err := read(t.Context + uint64(p.ObType)); err == nil && typ == p.ContextType {
					t.ContextOK = true
					t.ContextPrev, _ = read(t.Context + uint64(p.CtxPrev))
				}
			}
			out = append(out, t)
			if ts, err = read(ts + uint64(p.TstateNext)); err != nil {
				return nil, err
			}
		}
		if interp, err = read(interp + uint64(p.InterpNext)); err != nil {
			return nil, err
		}
	}
	return out, nil
}
