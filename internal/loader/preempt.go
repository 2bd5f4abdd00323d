//go:build linux

package loader

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// Preemption is what the running kernel does to uprobe programs halfway, and
// what gymtrace does about it (bpf/common/preempt.h).
//
// Uprobe programs run with only migration off. On a kernel that preempts
// (PREEMPT, PREEMPT_LAZY, PREEMPT_RT, or PREEMPT_DYNAMIC in full or lazy mode)
// another task can run gymtrace's programs on the same CPU while one is
// stopped, and the two share the per-CPU scratch: the Python link probes and
// the TLS return probe would then build a record from another run's values.
// bpf_preempt_disable (6.10+) keeps them whole; the TLS return probe also
// needs the verifier to let it call the parser's global functions with
// preemption off (not before 6.15 or so: probed, not assumed).
type Preemption struct {
	Preempts bool   // the kernel preempts tasks in kernel mode
	Mode     string // how that was told ("PREEMPT_DYNAMIC, mode full", ...)
	Kfunc    bool   // bpf_preempt_disable is there: the Python probes run whole
	PinTLS   bool   // ... and the TLS return probe may hold it over its calls
	// The kernel runs syscall tracepoint programs preemptible
	// (trace_call_bpf_faultable, sid's 7.2): where it preempts, they hold
	// preemption off when PinTLS says global calls may (gt_sys_pin).
	SyscallsFaultable bool
}

// PinSyscalls: the syscall programs hold preemption off (gt_sys_pin).
func (p Preemption) PinSyscalls() bool { return p.Preempts && p.SyscallsFaultable && p.PinTLS }

// SyscallsUnsafe says why the syscall programs cannot run whole here, or "".
func (p Preemption) SyscallsUnsafe() string {
	if p.Preempts && p.SyscallsFaultable && !p.PinTLS {
		return fmt.Sprintf("the kernel runs syscall tracepoint programs preemptible (trace_call_bpf_faultable; %s) and its verifier does not let them hold preemption off over their calls: a program stopped halfway makes the kernel skip the same program on its CPU meanwhile (gymtrace_kernel_events_total{reason=\"program_skipped\"}, requests without spans)", p.Mode)
	}
	return ""
}

// PythonUnsafe says why the Python link probes cannot run safely here, or "".
func (p Preemption) PythonUnsafe() string {
	if p.Preempts && !p.Kfunc {
		return fmt.Sprintf("the kernel preempts BPF uprobe programs (%s) and has no bpf_preempt_disable (Linux 6.10+) to keep them whole: asyncio parents could be wrong, so the Python probes stay off", p.Mode)
	}
	return ""
}

// TLSUnsafe says why the TLS probes cannot run safely here, or "".
func (p Preemption) TLSUnsafe() string {
	if p.Preempts && !p.PinTLS {
		return fmt.Sprintf("the kernel preempts BPF uprobe programs (%s) and its verifier does not let the TLS return probe keep preemption off over the parser's calls: TLS plaintext could be parsed from another run's scratch, so the TLS probes stay off", p.Mode)
	}
	return ""
}

// applyPreemption configures spec for what p found: the TLS return probe
// holds preemption off only where the verifier allows it.
func applyPreemption(spec *ebpf.CollectionSpec, p Preemption) error {
	if p.PinSyscalls() {
		if err := pinSyscalls(spec); err != nil {
			return err
		}
	}
	if p.PinTLS {
		return nil
	}
	if err := spec.Variables["gt_tls_pin"].Set(uint32(0)); err != nil {
		return fmt.Errorf("configuring the TLS return probe: %w", err)
	}
	return nil
}

// probePreemption asks the kernel. A probe that cannot load for another
// reason than the one asked about counts as "no".
func probePreemption() Preemption {
	var p Preemption
	p.Preempts, p.Mode = kernelPreempts()
	if kspec, err := btf.LoadKernelSpec(); err == nil {
		_, err := kspec.AnyTypeByName("bpf_preempt_disable")
		p.Kfunc = err == nil
		_, err = kspec.AnyTypeByName("trace_call_bpf_faultable")
		p.SyscallsFaultable = err == nil
	}
	// Only where the kernel preempts does the answer matter (PinSyscalls,
	// SyscallsUnsafe), and reading kallsyms costs a start ~140 ms.
	if !p.SyscallsFaultable && p.Preempts {
		p.SyscallsFaultable = kallsymsHas("trace_call_bpf_faultable")
	}
	if !p.Kfunc {
		return p
	}
	spec, err := loadProbepin()
	if err != nil {
		return p
	}
	coll, err := ebpf.NewCollection(spec)
	if err == nil {
		coll.Close()
		p.PinTLS = true
	}
	return p
}

// kernelPreempts reads the preemption model: debugfs's sched/preempt where
// mounted (PREEMPT_DYNAMIC's current mode), else the kernel's version
// string and config.
func kernelPreempts() (bool, string) {
	if b, err := os.ReadFile("/sys/kernel/debug/sched/preempt"); err == nil {
		if mode, ok := currentPreemptMode(string(b)); ok {
			return preemptingMode(mode), "PREEMPT_DYNAMIC, mode " + mode
		}
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false, "unknown"
	}
	version := unix.ByteSliceToString(u.Version[:])
	switch {
	case strings.Contains(version, "PREEMPT_RT"):
		return true, "PREEMPT_RT"
	case strings.Contains(version, "PREEMPT_LAZY"):
		return true, "PREEMPT_LAZY"
	case strings.Contains(version, "PREEMPT_DYNAMIC"):
		// The boot mode: preempt= on the command line, else the config's.
		if cmd, err := os.ReadFile("/proc/cmdline"); err == nil {
			for _, f := range strings.Fields(string(cmd)) {
				if m, ok := strings.CutPrefix(f, "preempt="); ok {
					return preemptingMode(m), "PREEMPT_DYNAMIC, preempt=" + m
				}
			}
		}
		cfg, err := kernelConfig(unix.ByteSliceToString(u.Release[:]))
		if err != nil {
			// Not known: say it preempts, the side that loses no parent.
			return true, "PREEMPT_DYNAMIC, mode not readable"
		}
		switch {
		case strings.Contains(cfg, "\nCONFIG_PREEMPT_NONE=y"):
			return false, "PREEMPT_DYNAMIC, boot default none"
		case strings.Contains(cfg, "\nCONFIG_PREEMPT_VOLUNTARY=y"):
			return false, "PREEMPT_DYNAMIC, boot default voluntary"
		}
		return true, "PREEMPT_DYNAMIC, boot default full or lazy"
	case strings.Contains(version, " PREEMPT "):
		return true, "PREEMPT"
	}
	return false, "not preemptible"
}

// currentPreemptMode reads debugfs's sched/preempt ("none voluntary (full)
// lazy"): the current mode is in parentheses.
func currentPreemptMode(s string) (string, bool) {
	i, j := strings.IndexByte(s, '('), strings.IndexByte(s, ')')
	if i < 0 || j <= i+1 {
		return "", false
	}
	return s[i+1 : j], true
}

// preemptingMode: every PREEMPT_DYNAMIC mode but none and voluntary
// preempts in kernel mode (full, lazy).
func preemptingMode(m string) bool { return m != "none" && m != "voluntary" }

// kernelConfig reads the running kernel's build configuration.
func kernelConfig(release string) (string, error) {
	if b, err := os.ReadFile("/boot/config-" + release); err == nil {
		return "\n" + string(b), nil
	}
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return "", errors.New("no /boot/config-" + release + " and no /proc/config.gz")
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, z); err != nil {
		return "", err
	}
	return "\n" + b.String(), nil
}

// pinSyscalls makes the syscall programs hold preemption off (gt_sys_pin).
func pinSyscalls(spec *ebpf.CollectionSpec) error {
	if err := spec.Variables["gt_sys_pin"].Set(uint32(1)); err != nil {
		return fmt.Errorf("configuring the syscall programs: %w", err)
	}
	return nil
}

// kallsymsHas: the kernel has a text symbol named name (a function the BTF
// may not list, inlined or static).
func kallsymsHas(name string) bool {
	b, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(" "+name+"\n"))
}
