package python

import (
	"fmt"
	"os/exec"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procCPU returns the CPU time of all of pid's threads in µs, from
// schedstat (ns resolution; /proc/PID/stat's ticks are too coarse here).
func procCPU(t *testing.T, pid int) float64 {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseFloat(f[0], 64)
			sum += ns / 1000
		}
	}
	return sum
}

// TestBenchLinkProbe measures what the link probe costs a real FastAPI
// process: app CPU per request and load throughput, with the probe attached
// and detached in interleaved runs. Opt in with GYMTRACE_BENCH=1 (about a
// minute).
func TestBenchLinkProbe(t *testing.T) {
	requireRoot(t)
	if os.Getenv("GYMTRACE_BENCH") == "" {
		t.Skip("benchmark: set GYMTRACE_BENCH=1")
	}
	which := "debian"
	if w := os.Getenv("GYMTRACE_PY"); w != "" {
		which = w
	}
	for _, args := range [][]string{
		{"--shape", "direct"},
		{"--shape", "direct", "--middleware"},
		{"--shape", "full"},
	} {
		t.Run(strings.Join(args, ""), func(t *testing.T) {
			objs := loadTestObjects(t)
			script := testdataScript(t, "causality_app.py")
			up, app := freePort(t), freePort(t)
			ports := []string{"--port", fmt.Sprint(app), "--upstream-port", fmt.Sprint(up)}
			// The app gets CPU 1 to itself, upstream and load share CPU 0, so
			// that the app's CPU time is not inflated by their contention.
			upDone := startBackground(t, pinned(t, "0", pyCmd(t, which, script, append([]string{"upstream"}, ports...)...)))
			appCmd := pinned(t, "1", pyCmd(t, which, script, append(append([]string{"app"}, ports...), args...)...))
			appDone := startBackground(t, appCmd)
			waitPort(t, up, upDone)
			waitPort(t, app, appDone)
			in, err := InspectInterpreter(appCmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if err := objs.GtPyProcs.Put(uint32(in.PID), in.Params); err != nil {
				t.Fatal(err)
			}
			const n, c = 2000, 16
			load := func() (cpuUs, rps float64) {
				before := procCPU(t, in.PID)
				start := time.Now()
				cmd := pinned(t, "0", pyCmd(t, which, script, append([]string{"load", "-n", fmt.Sprint(n), "-c", fmt.Sprint(c)}, ports...)...))
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("load: %v: %s", err, out)
				}
				el := time.Since(start).Seconds()
				return (procCPU(t, in.PID) - before) / n, n / el
			}
			stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				t.Fatal(err)
			}
			defer stats.Close()
			load() // warm up
			var off, on, bare [2]float64
			hitsBefore := statSum(t, objs, StatLinked)
			const rounds = 5
			for i := 0; i < rounds; i++ {
				cpu, rps := load()
				off[0] += cpu / rounds
				off[1] += rps / rounds
				probes, err := in.AttachProbes(objs.GtPyCopyRet)
				if err != nil {
					t.Fatal(err)
				}
				cpu, rps = load()
				on[0] += cpu / rounds
				on[1] += rps / rounds
				// Probe attached but the program returns at its first lookup:
				// the trap and return trampoline alone.
				if err := objs.GtPyProcs.Delete(uint32(in.PID)); err != nil {
					t.Fatal(err)
				}
				cpu, rps = load()
				bare[0] += cpu / rounds
				bare[1] += rps / rounds
				probes.Close()
				if err := objs.GtPyProcs.Put(uint32(in.PID), in.Params); err != nil {
					t.Fatal(err)
				}
			}
			progNs, progN := progStats(t, objs.GtPyCopyRet)
			hits := float64(statSum(t, objs, StatLinked)-hitsBefore) / float64(rounds*n)
			t.Logf("%s %v: app CPU %.0f µs/request without the probe, %.0f with (+%.1f µs, %.1f%%), %.0f with the probe but an empty program (+%.1f); "+
				"throughput %.0f vs %.0f req/s (ratio %.3f), %.0f with the empty program; %.1f probe hits/request; program %.0f ns/run, %d runs",
				in.Version, args, off[0], on[0], on[0]-off[0], 100*(on[0]-off[0])/off[0], bare[0], bare[0]-off[0],
				off[1], on[1], on[1]/off[1], bare[1], hits, float64(progNs)/float64(max(progN, 1)), progN)
		})
	}
}

// pinned runs cmd under taskset on the given CPU list (taskset execs in
// place, so the pid stays the interpreter's).
func pinned(t *testing.T, cpus string, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	ts, err := exec.LookPath("taskset")
	if err != nil {
		t.Skip("taskset not installed")
	}
	c := exec.Command(ts, append([]string{"-c", cpus}, cmd.Args...)...)
	c.Args[3] = cmd.Path
	return dieWithTest(c)
}
