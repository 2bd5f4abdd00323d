//go:build linux

package preflight

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// trivial returns a program that does nothing, of the given type.
func trivial(pt ebpf.ProgramType, ret int32) (*ebpf.Program, error) {
	return ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name:         "gt_preflight",
		Type:         pt,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()},
	}, ebpf.ProgramOptions{LogDisabled: true})
}

func (c *checker) tracepointAttach() {
	r := Result{Feature: "attach: syscall tracepoint", Need: NeedRequired, Detail: "syscalls/sys_enter_write, loaded, attached and detached"}
	err := func() error {
		prog, err := trivial(ebpf.TracePoint, 0)
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := link.Tracepoint("syscalls", "sys_enter_write", prog, nil)
		if err != nil {
			return fmt.Errorf("attaching: %w", err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = c.attachFix("CONFIG_FTRACE_SYSCALLS (syscall tracepoints) and a mounted tracefs")
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}

func (c *checker) attachFix(kernel string) string {
	if f := c.bpfFix(); f != "" {
		return f
	}
	if !c.caps.has(unix.CAP_PERFMON) && !c.caps.has(unix.CAP_SYS_ADMIN) {
		return "needs CAP_PERFMON (see the capability rows)"
	}
	return "the kernel needs " + kernel
}

func (c *checker) uprobeAttach() {
	r := Result{Feature: "attach: uprobe", Need: NeedRequired, Detail: "/proc/self/exe entry point, loaded, attached and detached"}
	err := func() error {
		exe, err := os.Executable()
		if err != nil {
			exe = "/proc/self/exe"
		}
		off, err := entryOffset(exe)
		if err != nil {
			return err
		}
		ex, err := link.OpenExecutable(exe)
		if err != nil {
			return fmt.Errorf("opening %s: %w", exe, err)
		}
		prog, err := trivial(ebpf.Kprobe, 0) // uprobes are kprobe-type programs
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := ex.Uprobe("", prog, &link.UprobeOptions{Address: off, PID: os.Getpid()})
		if err != nil {
			return fmt.Errorf("attaching: %w", err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = c.attachFix("CONFIG_UPROBE_EVENTS (Python context, TLS)")
		if c.bpfFix() == "" && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) && !c.caps.has(unix.CAP_SYS_ADMIN) {
			// Measured on Linux 6.18: CAP_PERFMON and CAP_BPF are not
			// enough for a uprobe perf event (docs/security.md).
			r.Fix = "this kernel refuses uprobe perf events without CAP_SYS_ADMIN: grant it (or run privileged)"
		}
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}

// entryOffset is the file offset of an ELF's entry point: a valid uprobe site
// even in a stripped binary.
func entryOffset(path string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("reading ELF %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && f.Entry >= p.Vaddr && f.Entry < p.Vaddr+p.Filesz {
			return f.Entry - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("%s: entry point %#x is in no executable segment", path, f.Entry)
}

func (c *checker) sockOpsAttach() {
	need := NeedOptional
	if c.o.Traceparent {
		need = NeedRequired
	}
	r := Result{Feature: "attach: sock_ops (cgroup)", Need: need}
	cg, err := CgroupV2Path()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "mount cgroup v2 (see the cgroup v2 row)"
		c.add(r)
		return
	}
	r.Detail = cg + ", loaded, attached and detached"
	err = func() error {
		prog, err := trivial(ebpf.SockOps, 1)
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: prog})
		if err != nil {
			return fmt.Errorf("attaching to %s: %w", cg, err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		switch {
		case c.bpfFix() != "":
			r.Fix = c.bpfFix()
		case !c.caps.has(unix.CAP_NET_ADMIN) && !c.caps.has(unix.CAP_SYS_ADMIN):
			r.Fix = "needs CAP_NET_ADMIN (see the capability rows); traceparent is then not injected into requests to other hosts"
		default:
			r.Fix = "the kernel needs CONFIG_CGROUP_BPF; traceparent is then not injected into requests to other hosts"
		}
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}
