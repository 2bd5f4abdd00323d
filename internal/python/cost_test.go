package python

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gymtrace/gymtrace/internal/probesite"
	pytestbpf "github.com/gymtrace/gymtrace/internal/python/pytest_bpf"
	"golang.org/x/sys/unix"
)

// costRun starts cost_loop.py, gives setup the inspected interpreter, lets
// the loop run and returns the script's ns per call.
func costRun(t *testing.T, which, mode string, n int, setup func(in *Interpreter) func()) float64 {
	t.Helper()
	cmd := pyCmd(t, which, testdataScript(t, "cost_loop.py"), mode, fmt.Sprint(n))
	var hello struct{ PID int }
	s := startJSON(t, cmd, &hello)
	in, err := InspectInterpreter(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	undo := setup(in)
	defer undo()
	fmt.Fprintln(s.stdin, "go")
	var res struct {
		NsPerCall float64 `json:"ns_per_call"`
	}
	line, err := s.out.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &res) != nil {
		t.Fatalf("cost loop gave %q: %v", line, err)
	}
	return res.NsPerCall
}

// probeTestSetup loads the test objects with bpf_stats on (until the test
// ends) and names the interpreter to run: GYMTRACE_PY, debian by default.
func probeTestSetup(t *testing.T) (*pytestbpf.Objects, string) {
	t.Helper()
	requireRoot(t)
	which := "debian"
	if w := os.Getenv("GYMTRACE_PY"); w != "" {
		which = w
	}
	objs := loadTestObjects(t)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enabling bpf_stats: %v", err)
	}
	t.Cleanup(func() { stats.Close() })
	return objs, which
}

func progStats(t *testing.T, p *ebpf.Program) (ns, count uint64) {
	t.Helper()
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(st.Runtime), st.RunCount
}

// TestCostContextRead measures what gt_py_context adds to a syscall
// tracepoint program: bpf_stats run time of a program calling it minus one
// doing only the gt_py_procs lookup, both on sys_enter_getppid.
func TestCostContextRead(t *testing.T) {
	for _, which := range []string{"debian", "trixie"} {
		t.Run(which, func(t *testing.T) {
			objs := loadTestObjects(t)
			stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				t.Fatalf("enabling bpf_stats: %v", err)
			}
			defer stats.Close()
			const n = 200000
			costRun(t, which, "getppid", n, func(in *Interpreter) func() {
				if err := objs.GtPyProcs.Put(uint32(in.PID), in.Params); err != nil {
					t.Fatal(err)
				}
				attachTP(t, "sys_enter_getppid", objs.PytestCostBase)
				attachTP(t, "sys_enter_getppid", objs.PytestCostCtx)
				return func() {}
			})
			baseNs, baseN := progStats(t, objs.PytestCostBase)
			ctxNs, ctxN := progStats(t, objs.PytestCostCtx)
			if baseN < n || ctxN < n {
				t.Fatalf("programs ran %d and %d times, want >= %d", baseN, ctxN, n)
			}
			base := float64(baseNs) / float64(baseN)
			full := float64(ctxNs) / float64(ctxN)
			t.Logf("per call: lookup-only program %.0f ns, program with gt_py_context %.0f ns: gt_py_context costs %.0f ns",
				base, full, full-base)
			logStats(t, objs.GtPyStats)
			if full-base > 2000 {
				t.Errorf("gt_py_context costs %.0f ns a call; the cached path should be well under 1 µs", full-base)
			}
		})
	}
}

// TestCostCopyProbe measures the link probe's price per PyContext_CopyCurrent
// call as the process sees it (trap + return trampoline + program), against
// no probe and against a plain entry uprobe running the same program.
func TestCostCopyProbe(t *testing.T) {
	objs, which := probeTestSetup(t)
	const n = 100000
	put := func(in *Interpreter) {
		if err := objs.GtPyProcs.Put(uint32(in.PID), in.Params); err != nil {
			t.Fatal(err)
		}
	}
	none := costRun(t, which, "copy", n, func(in *Interpreter) func() { put(in); return func() {} })
	ret := costRun(t, which, "copy", n, func(in *Interpreter) func() {
		put(in)
		c, err := in.AttachProbes(objs.GtPyCopyRet)
		if err != nil {
			t.Fatal(err)
		}
		return func() { c.Close() }
	})
	progNs, progN := progStats(t, objs.GtPyCopyRet)
	entry := costRun(t, which, "copy", n, func(in *Interpreter) func() {
		put(in)
		ex, err := link.OpenExecutable(in.ELFPath)
		if err != nil {
			t.Fatal(err)
		}
		// Same program as an entry probe: it then links whatever is in the
		// return register at entry; only the timing matters here.
		off, _, err := probeOffset(in.ELFPath, ProbeSymbol)
		if err != nil {
			t.Fatal(err)
		}
		ls, err := probesite.Attach(ex, objs.GtPyCopyRet, in.PID, false, []probesite.Spec{{Symbol: ProbeSymbol, Offset: off}})
		if err != nil {
			t.Fatal(err)
		}
		return func() { ls[0].Close() }
	})
	t.Logf("PyContext_CopyCurrent via ctypes: %.0f ns/call bare, %.0f with the uretprobe (+%.0f), %.0f with an entry uprobe (+%.0f); "+
		"BPF program alone %.0f ns/run over %d runs",
		none, ret, ret-none, entry, entry-none, float64(progNs)/float64(max(progN, 1)), progN)
	if progN < 5*n {
		t.Errorf("the return probe ran %d times for %d calls", progN, 5*n)
	}
	// Ensure the probes are gone: a run after detaching costs as much as none.
	after := costRun(t, which, "copy", n, func(in *Interpreter) func() { put(in); return func() {} })
	if _, n2 := progStats(t, objs.GtPyCopyRet); n2 > progN+uint64(5*n)+1000 {
		t.Errorf("probe still firing after Close: %d runs", n2)
	}
	t.Logf("after detaching: %.0f ns/call", after)
}
