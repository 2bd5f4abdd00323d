//go:build linux

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLateStarters: gymtrace runs first, with discovery and no --pid; the
// stack's servers are then started as Gym starts them (bash -c with
// NEMO_GYM_CONFIG_DICT/NEMO_GYM_CONFIG_PATH), and collection starts the
// moment every server answers. Every rollout must be whole from the first
// one, five runs in a row, on the default loop and on uvloop, 3.11 and 3.13.
func TestLateStarters(t *testing.T) {
	needStack(t)
	const runs, n, c = 5, 16, 16
	for _, py := range causalityInterps {
		if py.name == "3.14" || py.name == "pbs3.14" {
			continue // 3.11 and 3.13 are the rows asked for; 3.14 runs in TestCausality
		}
		for _, loop := range []string{"asyncio", "uvloop"} {
			t.Run(fmt.Sprintf("py%s_%s", py.name, loop), func(t *testing.T) {
				if why := py.skipCheck(); why != "" {
					t.Skip(why)
				}
				var launch []string
				if r := py.root; r != nil {
					dir, err := r.stackDir()
					if err != nil {
						t.Fatal(err)
					}
					launch = []string{"--python", "chroot " + r.root + " " + r.python, "--stack-dir", dir}
				}
				for run := 1; run <= runs; run++ {
					lateStartRun(t, py, launch, loop, run, n, c)
				}
			})
		}
	}
}

var (
	tracingLine = regexp.MustCompile(`time=(\S+) level=INFO msg=tracing pid=(\d+)`)
	interpLine  = regexp.MustCompile(`time=(\S+) level=DEBUG msg="python interpreter found" pid=(\d+)`)
)

// startedAt is when process pid started, from /proc (10 ms resolution).
func startedAt(pid int) (time.Time, bool) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 20 {
		return time.Time{}, false
	}
	ticks, _ := strconv.ParseInt(f[19], 10, 64) // field 22: starttime
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, false
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			bt, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Unix(bt, 0).Add(time.Duration(ticks) * 10 * time.Millisecond), true
		}
	}
	return time.Time{}, false
}

// sinceStart: from each server's start to when gymtrace traced it and read
// its interpreter (the last is when its first request gets parents).
func sinceStart(log string, pids map[string]int) string {
	at := func(re *regexp.Regexp) map[int]time.Time {
		out := map[int]time.Time{}
		for _, m := range re.FindAllStringSubmatch(log, -1) {
			if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				pid, _ := strconv.Atoi(m[2])
				out[pid] = t
			}
		}
		return out
	}
	traced, read := at(tracingLine), at(interpLine)
	var parts []string
	for _, k := range []string{"agent", "model", "resources"} {
		p := pids[k]
		st, ok := startedAt(p)
		if !ok {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: traced %v, interpreter read %v after start", k,
			traced[p].Sub(st).Round(time.Millisecond), read[p].Sub(st).Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}

func lateStartRun(t *testing.T, py causalityInterp, launch []string, loop string, run, n, c int) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "spans.jsonl")
	gt := startGymtrace(t, gtOpts{groups: "per_rollout", jsonl: out, extra: []string{"--log-level", "debug"}})
	host, inside := py.truthDir(t)
	args := append(append([]string{}, launch...), "--shell", "--loop", loop, "--http", "httptools",
		"--warmup", "0", "--truth", filepath.Join(inside, "truth.jsonl"))
	st := startStack(t, t, args...)
	answered := time.Now() // launch.py prints its ready line once every server answers
	pids := map[string]int{}
	for _, k := range []string{"agent", "model", "resources"} {
		pids[k] = st.ready.Servers[k].PID
	}
	starts := sinceStart(gt.Stderr.String(), pids) // while the servers run
	sum := st.collect(t, n, c, true)
	gt.settle(t, 1)
	gt.shutdown(t)
	recs, err := waitTruth(filepath.Join(host, "truth.jsonl"), 0, n)
	if err != nil {
		t.Fatal(err)
	}
	sc := scoreCausality(recs, readSpans(t, out), st.pids())
	// How long before the servers answered each was traced (negative: after).
	lead := map[int]time.Duration{}
	for _, m := range tracingLine.FindAllStringSubmatch(gt.Stderr.String(), -1) {
		at, err := time.Parse(time.RFC3339Nano, m[1])
		pid, _ := strconv.Atoi(m[2])
		if err == nil {
			lead[pid] = answered.Sub(at)
		}
	}
	var leads []string
	for _, k := range []string{"agent", "model", "resources"} {
		p := st.ready.Servers[k].PID
		d, ok := lead[p]
		if !ok {
			leads = append(leads, k+" never traced")
			continue
		}
		leads = append(leads, fmt.Sprintf("%s traced %v before it answered", k, d.Round(time.Millisecond)))
	}
	t.Logf("run %d: %d rollouts ok; whole %d/%d, outbound %d, correct %d, wrong %d, unattributed %d (%s); server spans %d/%d, client spans %d/%d; %v",
		run, sum.OK, sc.RolloutsOneTrace, sc.Rollouts, sc.Outbound, sc.Correct, sc.Wrong, sc.Unattributed, sc.ReasonsString(),
		sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound, leads)
	t.Logf("run %d, discovery to traced: %s", run, starts)
	if sc.Rollouts != n || sc.RolloutsOneTrace != n || sc.Wrong != 0 || sc.Correct != sc.Outbound ||
		sc.ServerSpans != sc.Inbound || sc.ClientSpans != sc.Outbound {
		t.Errorf("run %d: %d of %d rollouts whole, %d of %d calls right (%d wrong), spans %d/%d server, %d/%d client: "+
			"servers started after gymtrace must be traced from their first request", run, sc.RolloutsOneTrace, n,
			sc.Correct, sc.Outbound, sc.Wrong, sc.ServerSpans, sc.Inbound, sc.ClientSpans, sc.Outbound)
		if len(sc.Examples) > 0 {
			t.Logf("first findings: %v", sc.Examples)
		}
		t.Logf("gymtrace's warnings:\n%s", warnings(gt.Stderr.String()))
	}
	for _, k := range []string{"agent", "model", "resources"} {
		if _, ok := lead[st.ready.Servers[k].PID]; !ok {
			t.Errorf("run %d: the %s server (pid %d) was never traced", run, k, st.ready.Servers[k].PID)
		}
	}
	st.Stop(10 * time.Second)
}

// warnings are the WARN and ERROR lines of a log.
func warnings(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
