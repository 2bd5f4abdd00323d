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
