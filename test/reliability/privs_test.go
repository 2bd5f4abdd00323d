//go:build linux

package reliability

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCaps reads one capability set (CapEff, CapPrm, CapBnd, ...) of every
// thread of pid: tid -> mask.
func threadCaps(t *testing.T, pid int, field string) map[string]uint64 {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/status")
		if err != nil {
			continue // a thread that just ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatalf("%s of thread %s: %q", field, e.Name(), v)
				}
				out[e.Name()] = n
			}
		}
	}
	return out
}

// TestCapabilitiesDroppedAfterAttach: once attached, no thread of gymtrace
// holds a capability beyond what its enabled features still use, in its
// effective, permitted or bounding set: CAP_SYS_PTRACE and
// CAP_DAC_READ_SEARCH for discovery, plus CAP_PERFMON, CAP_BPF,
// CAP_CHECKPOINT_RESTORE and CAP_SYS_ADMIN while uprobes are attached to
// targets found later (HTTPS capture, asyncio context links). Tracing, and
// SIGHUP reloads (map writes through open fds), still work, and a Python
// target found after the drop gets its uprobes.
func TestCapabilitiesDroppedAfterAttach(t *testing.T) {
	needRoot(t)
	discovery := uint64(1)<<unix.CAP_SYS_PTRACE | uint64(1)<<unix.CAP_DAC_READ_SEARCH
	uprobes := discovery | uint64(1)<<unix.CAP_PERFMON | uint64(1)<<unix.CAP_BPF | uint64(1)<<unix.CAP_CHECKPOINT_RESTORE |
		uint64(1)<<unix.CAP_SYS_ADMIN
	for _, tc := range []struct {
		name    string
		groups  string
		role    string
		method  string
		allowed uint64
		match   func(s span, path string) bool
	}{
		// gym.verify only: no HTTP span group, so no TLS uprobes later.
		{"verify-only", "verify", "=resources", "POST", discovery,
			func(s span, _ string) bool { return s.Name == "gym.verify" }},
		// server spans: HTTPS capture attaches uprobes to later targets.
		{"server", "server", "", "GET", uprobes,
			func(s span, path string) bool { return s.path() == path }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t)
			g := startGymtrace(t, gtOpts{groups: tc.groups, extra: []string{"--pid", fmt.Sprintf("%d%s", srv.Pid(), tc.role)}})
			g.WaitOutput(t, true, "capabilities dropped after attach", 5*time.Second)
			mustLack := map[string]int{"CAP_NET_ADMIN": unix.CAP_NET_ADMIN,
				"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_SYS_MODULE": unix.CAP_SYS_MODULE,
				"CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_SETUID": unix.CAP_SETUID, "CAP_KILL": unix.CAP_KILL}
			if tc.allowed == discovery {
				mustLack["CAP_BPF"], mustLack["CAP_PERFMON"] = unix.CAP_BPF, unix.CAP_PERFMON
				mustLack["CAP_SYS_ADMIN"] = unix.CAP_SYS_ADMIN
			}
			var sample uint64
			for _, field := range []string{"CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"} {
				caps := threadCaps(t, g.Pid(), field)
				if len(caps) < 2 {
					t.Fatalf("read %s of only %d threads of gymtrace", field, len(caps))
				}
				for tid, c := range caps {
					for name, bit := range mustLack {
						if c&(1<<bit) != 0 {
							t.Errorf("gymtrace thread %s still has %s in %s (%016x) after attach", tid, name, field, c)
						}
					}
					if c&^tc.allowed != 0 {
						t.Errorf("gymtrace thread %s: %s %016x holds more than %016x", tid, field, c, tc.allowed)
					}
					if field == "CapEff" {
						sample = c
					}
				}
			}

			// Tracing still works, and after a SIGHUP reload (it writes
			// the gate map through its fd, without CAP_BPF).
			for _, step := range []string{"after-drop", "after-reload"} {
				if step == "after-reload" {
					syscall.Kill(g.Pid(), syscall.SIGHUP)
					g.WaitOutput(t, true, "config reloaded", 5*time.Second)
					if strings.Contains(g.Stderr.String(), "applying the reloaded config failed") {
						t.Fatalf("SIGHUP reload failed with capabilities dropped:\n%s", tail(g.Stderr.String(), 2048))
					}
				}
				n := len(readSpans(t, g.jsonl))
				path := uniquePath(step)
				if tc.method == "POST" {
					path = "/verify"
				}
				send(t, tc.method, srv.url(path))
				deadline := time.Now().Add(30 * time.Second)
				for {
					got := readSpans(t, g.jsonl)
					found := false
					for _, s := range got[min(n, len(got)):] {
						found = found || tc.match(s, path)
					}
					if found {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("no span for %s %s %s", tc.method, path, step)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			g.terminate(t)
			t.Logf("--span-groups %s: every thread has CapEff=CapPrm=CapBnd=%016x; tracing and SIGHUP reload work", tc.groups, sample)
		})
	}
}

// TestMissingCapabilityError: started without CAP_BPF and CAP_SYS_ADMIN (as
// capsh drops them from the bounding set), gymtrace refuses before attaching
// anything, with one line naming the missing capability.
func TestMissingCapabilityError(t *testing.T) {
	needRoot(t)
	capsh, err := exec.LookPath("capsh")
	if err != nil {
		t.Skip("needs capsh (apt-get install libcap2-bin)")
	}
	srv := startServer(t)
	cmd := exec.Command(capsh, "--drop=cap_bpf,cap_sys_admin", "--",
		"-c", fmt.Sprintf(`exec "$0" --pid %d --span-groups server --exporter jsonl --output /dev/null`, srv.Pid()), gymtraceBin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("gymtrace without CAP_BPF ran on for 30s instead of refusing; stderr:\n%s", stderr.String())
	}
	code := cmd.ProcessState.ExitCode()
	if code == 0 {
		t.Fatalf("gymtrace without CAP_BPF and CAP_SYS_ADMIN exited 0; stderr:\n%s", stderr.String())
	}
	errLine := lastErrorLine(stderr.String())
	if errLine == "" {
		t.Fatalf("no `gymtrace: ...` error line on stderr:\n%s", stderr.String())
	}
	if !strings.Contains(errLine, "CAP_BPF") {
		t.Errorf("the error does not name the missing CAP_BPF: %q", errLine)
	}
	if strings.Contains(stderr.String(), "gymtrace: attached") {
		t.Errorf("gymtrace attached although it lacks CAP_BPF")
	}
	checkNoPanic(t, "gymtrace", stderr.String())
	t.Logf("exit %d: %s", code, errLine)
}

// lastErrorLine is the "gymtrace: ..." line a failed run ends with, and
// checks that it is the only such line.
func lastErrorLine(stderr string) string {
	var found []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if strings.HasPrefix(l, "gymtrace: ") {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// TestUprobesAfterDrop: a Python process gymtrace finds after it dropped its
// capabilities still gets its uprobes (the asyncio context link and the
// OpenSSL probes). Without CAP_SYS_ADMIN this kernel refuses the perf
// event, and every later target silently lost its causality and HTTPS.
func TestUprobesAfterDrop(t *testing.T) {
	needRoot(t)
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("%s is missing (apt-get install python3): %v", py, err)
	}
	cmd := exec.Command(py, "-c", "import asyncio, ssl, time; time.sleep(60)")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	time.Sleep(300 * time.Millisecond) // let it load libssl
	// startGymtrace returns once gymtrace has attached.
	g := startGymtrace(t, gtOpts{groups: "per_rollout", extra: []string{"--pid", fmt.Sprintf("%d=agent", cmd.Process.Pid)}})
	time.Sleep(500 * time.Millisecond)
	out := g.Stderr.String()
	if !strings.Contains(out, "capabilities dropped after attach") {
		t.Fatalf("no capability drop logged:\n%s", tail(out, 2048))
	}
	for _, bad := range []string{"asyncio child-task links off", "could not be probed"} {
		if strings.Contains(out, bad) {
			t.Fatalf("a target attached after the drop lost its uprobes (%q):\n%s", bad, tail(out, 4096))
		}
	}
	g.terminate(t)
}
