//go:build linux

package loader

import (
	"strings"
	"testing"
)

func TestCurrentPreemptMode(t *testing.T) {
	for _, c := range []struct {
		in, mode     string
		ok, preempts bool
	}{
		{"none voluntary (full) lazy\n", "full", true, true},
		{"none (voluntary) full lazy\n", "voluntary", true, false},
		{"(none) voluntary full\n", "none", true, false},
		{"none voluntary full (lazy)\n", "lazy", true, true},
		{"none voluntary full lazy\n", "", false, false},
		{"()", "", false, false},
	} {
		mode, ok := currentPreemptMode(c.in)
		if mode != c.mode || ok != c.ok {
			t.Errorf("currentPreemptMode(%q) = %q, %v; want %q, %v", c.in, mode, ok, c.mode, c.ok)
		}
		if ok && preemptingMode(mode) != c.preempts {
			t.Errorf("preemptingMode(%q) = %v, want %v", mode, !c.preempts, c.preempts)
		}
	}
}

// TestPreemptionUnsafe: what stays off follows from what the kernel does
// and what it allows; nothing is off where it does not preempt.
func TestPreemptionUnsafe(t *testing.T) {
	for _, c := range []struct {
		p           Preemption
		python, tls bool // unsafe
	}{
		{Preemption{Preempts: false}, false, false},
		{Preemption{Preempts: true, Mode: "PREEMPT_LAZY"}, true, true},
		{Preemption{Preempts: true, Kfunc: true}, false, true},
		{Preemption{Preempts: true, Kfunc: true, PinTLS: true}, false, false},
	} {
		py, tls := c.p.PythonUnsafe(), c.p.TLSUnsafe()
		if (py != "") != c.python || (tls != "") != c.tls {
			t.Errorf("%+v: python unsafe %q, TLS unsafe %q; want %v, %v", c.p, py, tls, c.python, c.tls)
		}
		if py != "" && !strings.Contains(py, "Python probes stay off") {
			t.Errorf("python reason %q does not say what stays off", py)
		}
	}
}

// TestProbePreemption asks this kernel (root: the probe loads a program).
func TestProbePreemption(t *testing.T) {
	needRoot(t)
	p := probePreemption()
	t.Logf("%+v", p)
	if p.PinTLS && !p.Kfunc {
		t.Errorf("TLS pinned without bpf_preempt_disable: %+v", p)
	}
}

// TestVerifyPinnedSyscalls: the syscall programs as a kernel that runs them
// preemptible loads them (gt_sys_pin: preemption off over the whole run,
// global calls included) verify here too, where this kernel's verifier
// allows global calls with preemption off.
func TestVerifyPinnedSyscalls(t *testing.T) {
	needRoot(t)
	p := probePreemption()
	if !p.Kfunc || !p.PinTLS {
		t.Skipf("this kernel cannot hold preemption off over global calls (bpf_preempt_disable %v, verifier allows it %v): the pinned build is checked where it can be", p.Kfunc, p.PinTLS)
	}
	rep, err := Verify(VerifyOptions{PinSyscalls: true, Only: func(name string) bool {
		return strings.HasPrefix(name, "gt_exit_") || strings.HasPrefix(name, "gt_inject_enter_")
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range rep.Programs {
		if pr.Err != nil {
			t.Errorf("%s (pinned): %v", pr.Name, pr.Err)
			continue
		}
		t.Logf("%s (pinned): %d instructions, %d bytes of stack", pr.Name, pr.Verified, pr.Stack)
	}
	if len(rep.Programs) < 8 {
		t.Errorf("%d syscall programs verified, want the 8 data syscalls' and injection's", len(rep.Programs))
	}
}
