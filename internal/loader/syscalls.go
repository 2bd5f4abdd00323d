//go:build linux

package loader

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// syscall tracepoints, in attach order. Only exits of the data syscalls are
// hooked (arguments come from the saved registers), plus the entry of close
// and the exit of listen.
// Each has an understudy (bpf/common/understudy.h), attached after it where
// the kernel runs syscall programs preemptible (Preemption.PinSyscalls), and
// a slot in gt_sys_tails.
func (t *Tracer) tracepoints() []syscallProgram {
	p := &t.objs.bpfPrograms
	return []syscallProgram{
		{"sys_exit_read", p.GtExitRead, p.GtUsRead, SysExitRead},
		{"sys_exit_recvfrom", p.GtExitRecvfrom, p.GtUsRecvfrom, SysExitRecvfrom},
		{"sys_exit_readv", p.GtExitReadv, p.GtUsReadv, SysExitReadv},
		{"sys_exit_recvmsg", p.GtExitRecvmsg, p.GtUsRecvmsg, SysExitRecvmsg},
		{"sys_exit_write", p.GtExitWrite, p.GtUsWrite, SysExitWrite},
		{"sys_exit_sendto", p.GtExitSendto, p.GtUsSendto, SysExitSendto},
		{"sys_exit_writev", p.GtExitWritev, p.GtUsWritev, SysExitWritev},
		{"sys_exit_sendmsg", p.GtExitSendmsg, p.GtUsSendmsg, SysExitSendmsg},
		{"sys_enter_close", p.GtEnterClose, p.GtUsClose, SysEnterClose},
		{"sys_exit_listen", p.GtExitListen, p.GtUsListen, SysExitListen}, // the startup group (bpf/startup.h)
	}
}

// A syscall tracepoint's program, its understudy and its slot.
type syscallProgram struct {
	name        string
	prog, under *ebpf.Program
	slot        uint32
}

// understudies says whether the syscall programs get understudies here:
// where they hold preemption off (gt_sys_pin), the only place their marks
// are compiled in.
func (t *Tracer) understudies() bool { return t.preempt.PinSyscalls() }

// attachSyscall attaches a syscall program, then, where understudies are
// on, puts it in its gt_sys_tails slot and attaches its understudy after
// it (the kernel runs a tracepoint's programs in attach order).
func (t *Tracer) attachSyscall(tp syscallProgram) error {
	l, err := link.Tracepoint("syscalls", tp.name, tp.prog, nil)
	if err != nil {
		return fmt.Errorf("attaching tracepoint syscalls/%s (is tracefs mounted at /sys/kernel/tracing? run `gymtrace check`): %w", tp.name, err)
	}
	t.links = append(t.links, l)
	if !t.understudies() || tp.under == nil {
		return nil
	}
	if err := t.objs.GtSysTails.Put(tp.slot, tp.prog); err != nil {
		return fmt.Errorf("giving syscalls/%s's understudy its program: %w", tp.name, err)
	}
	l, err = link.Tracepoint("syscalls", tp.name, tp.under, nil)
	if err != nil {
		return fmt.Errorf("attaching the understudy of syscalls/%s: %w", tp.name, err)
	}
	t.links = append(t.links, l)
	return nil
}

// Understudied names the syscall programs that have an understudy here:
// the runs the kernel skipped of these, the understudy made (bpf/common/understudy.h).
func (t *Tracer) Understudied() map[string]*ebpf.Program {
	m := map[string]*ebpf.Program{}
	if !t.understudies() {
		return m
	}
	for _, tp := range t.tracepoints() {
		if tp.under != nil {
			m[tp.name] = tp.prog
		}
	}
	return m
}
