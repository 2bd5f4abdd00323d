package python

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Probes are the uprobes attached to one process. Close detaches them; with
// them detached the process takes no uprobe trap at all.
type Probes struct {
	links []link.Link
}

// Close detaches every probe, all at once (probesite.CloseAll); it is safe
// to call more than once.
func (p *Probes) Close() error {
	err := probesite.CloseAll(p.links)
	p.links = nil
	return err
}

// AttachProbes attaches copyRet (gt_py_copy_ret from bpf/python_probes.h) as
// a return probe on PyContext_CopyCurrent of this interpreter, filtered to
// this process so that other processes running the same binary take no trap.
// The process's gt_py_procs entry must be written before (or soon after):
// without it the program returns at once.
func (in *Interpreter) AttachProbes(copyRet *ebpf.Program) (io.Closer, error) {
	if copyRet == nil {
		return nil, errors.New("attaching CPython probes: no gt_py_copy_ret program")
	}
	off, cheap, err := probeOffset(in.ELFPath, ProbeSymbol)
	if err != nil {
		return nil, fmt.Errorf("reading %s in %s of process %d: %w", ProbeSymbol, in.MappedPath, in.PID, err)
	}
	if !cheap {
		slog.Warn("the probed instruction is not one the kernel emulates: each hit single-steps (about 20 µs)",
			"component", "python", "pid", in.PID, "file", in.MappedPath, "symbol", ProbeSymbol, "offset", off)
	}
	ex, err := link.OpenExecutable(in.ELFPath)
	if err != nil {
		return nil, fmt.Errorf("opening %s of process %d for uprobes: %w", in.MappedPath, in.PID, err)
	}
	// A return probe placed after the function's first instructions still
	// sees the return address on top of the stack: probesite.Return only
	// moves past ones that leave %rsp alone.
	specs := []probesite.Spec{{Symbol: ProbeSymbol, Offset: off}}
	// contextvars.Context() makes a fresh context without copying (uvicorn's
	// --reset-contextvars starts every request in one). Unseen, it would
	// reuse a recycled address and inherit a dead context's root. The same
	// program on its constructor's return gives it a birth of its own.
	cn, cnErr := in.contextNewSpec()
	if cnErr == nil {
		specs = append(specs, cn)
	}
	ls, err := probesite.Attach(ex, copyRet, in.PID, true, specs)
	if both := err; both != nil && cnErr == nil {
		// All or nothing: without the constructor's probe, the copies' alone.
		if ls, err = probesite.Attach(ex, copyRet, in.PID, true, specs[:1]); err == nil {
			cnErr = fmt.Errorf("attaching its return probe: %w", both)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("attaching a return probe to %s in %s of process %d: %w",
			ProbeSymbol, in.MappedPath, in.PID, err)
	}
	if cnErr != nil {
		slog.Warn("contexts made by contextvars.Context() are not seen: calls made in them may stay unattributed",
			"component", "python", "pid", in.PID, "err", cnErr)
	}
	return &Probes{links: ls}, nil
}

// offsetof(PyTypeObject, tp_new) on 64-bit builds, 3.11-3.14.
const tpNewOffset = 312

// contextNewSpec is where the return probe on PyContext_Type.tp_new
// (context_tp_new, static, so not in .dynsym) goes: its address is read
// from the live type object.
func (in *Interpreter) contextNewSpec() (probesite.Spec, error) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", in.PID))
	if err != nil {
		return probesite.Spec{}, err
	}
	defer mem.Close()
	var b [8]byte
	if _, err := mem.ReadAt(b[:], int64(in.Params.ContextType+tpNewOffset)); err != nil {
		return probesite.Spec{}, fmt.Errorf("reading PyContext_Type.tp_new: %w", err)
	}
	addr := binary.LittleEndian.Uint64(b[:])
	if addr < in.Bias {
		return probesite.Spec{}, fmt.Errorf("PyContext_Type.tp_new %#x is not in %s", addr, in.MappedPath)
	}
	f, err := elf.Open(in.ELFPath)
	if err != nil {
		return probesite.Spec{}, err
	}
	defer f.Close()
	vaddr := addr - in.Bias
	// Its size is not known (static, not in .dynsym), so the probe stays at
	// the entry (probesite.Return would answer the same without a size).
	off, cheap, err := probesite.Entry(f, vaddr)
	if err != nil {
		return probesite.Spec{}, fmt.Errorf("PyContext_Type.tp_new %#x: %w", vaddr, err)
	}
	if !cheap {
		return probesite.Spec{}, fmt.Errorf("PyContext_Type.tp_new at %#x starts with an instruction the kernel single-steps", vaddr)
	}
	foff, err := probesite.FileOffset(f, vaddr)
	if err != nil {
		return probesite.Spec{}, fmt.Errorf("PyContext_Type.tp_new %#x in %s: %w", vaddr, in.MappedPath, err)
	}
	return probesite.Spec{Address: foff, Offset: off}, nil
}

// AttachProbes inspects pid and attaches the context-link probe; see
// (*Interpreter).AttachProbes.
func AttachProbes(pid int, copyRet *ebpf.Program) (io.Closer, error) {
	in, err := InspectInterpreter(pid)
	if err != nil {
		return nil, err
	}
	return in.AttachProbes(copyRet)
}

// probeOffset is where in symbol the return probe goes (probesite.Return):
// on an instruction the kernel emulates, where the call's stack is still
// untouched, when the function's start has one; cheap reports whether it
// does. Debian 12's 3.11 and 13's 3.13 start with a push (after endbr64 on
// 13); sid's 3.14 with loads and a test, so the probe sits on the je after
// them.
func probeOffset(path, symbol string) (off uint64, cheap bool, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return 0, false, err
	}
	for _, s := range syms {
		if s.Name == symbol && s.Value != 0 {
			return probesite.Return(f, s.Value, s.Size)
		}
	}
	return 0, false, fmt.Errorf("no %s in .dynsym", symbol)
}
