//go:build linux

// Package conformance checks that a process traced by gymtrace, with
// traceparent injection on and every group enabled, sees exactly the socket
// API it sees untraced: sockprog (./sockprog) runs the same checks both ways
// and the two sets of observations must be equal.
//
//	sudo go test ./test/conformance -v -count=1
package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/testproc"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds gymtrace and sockprog once, or takes them from
// GYMTRACE_TEST_BIN_DIR (a guest of scripts/kernel-matrix).
func binaries(t *testing.T) (gymtrace, sockprog string) {
	t.Helper()
	if g := testproc.Prebuilt(t, "gymtrace"); g != "" {
		return g, testproc.Prebuilt(t, "sockprog")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gymtrace-conformance-")
		if buildErr != nil {
			return
		}
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		for _, j := range [][2]string{{"gymtrace", "./cmd/gymtrace"}, {"sockprog", "./test/conformance/sockprog"}} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, j[0]), j[1])
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", j[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "gymtrace"), filepath.Join(binDir, "sockprog")
}

// observe runs sockprog, traced by gymtrace with extra flags when traced.
func observe(t *testing.T, traced bool, extra ...string) ([][2]string, *testproc.Proc) {
	t.Helper()
	gymtrace, sockprog := binaries(t)
	p := testproc.Start(t, t, "sockprog", []string{sockprog}, testproc.Options{})
	line := p.FirstLine(t, testproc.Slow(10*time.Second))
	if !strings.HasPrefix(line, "ready ") {
		t.Fatalf("sockprog: %q", line)
	}
	var g *testproc.Proc
	if traced {
		argv := append([]string{gymtrace, "--pid", fmt.Sprintf("%d=agent", p.Pid()), "--span-groups", "all",
			"--inject=true", "--exporter", "jsonl", "--output", os.DevNull, "--log-level", "debug"}, extra...)
		g = testproc.Start(t, t, "gymtrace", argv, testproc.Options{})
		g.WaitOutput(t, true, "gymtrace: attached", testproc.Slow(60*time.Second))
	}
	fmt.Fprintln(p.Stdin, "go")
	select {
	case <-p.Done:
	case <-time.After(testproc.Slow(60 * time.Second)):
		t.Fatalf("sockprog did not finish:\n%s", testproc.Tail(p.Stderr.String(), 2000))
	}
	lines := strings.Split(strings.TrimSpace(p.Stdout.String()), "\n")
	var got [][2]string
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("sockprog's output: %v\n%s\n%s", err, p.Stdout.String(), p.Stderr.String())
	}
	return got, g
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: gymtrace loads BPF programs and attaches sock_ops to the cgroup v2 root (sudo go test ./test/conformance)")
	}
}

// compare lays out the two sets of observations and counts the checks
// that differ.
func compare(base, traced [][2]string) (string, []string) {
	var b strings.Builder
	b.WriteString("| check | untraced | traced | same |\n|---|---|---|---|\n")
	var diff []string
	for i, kv := range base {
		tv := "(missing)"
		if i < len(traced) && traced[i][0] == kv[0] {
			tv = traced[i][1]
		}
		same := "yes"
		if tv != kv[1] {
			same = "**NO**"
			diff = append(diff, kv[0])
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", kv[0], kv[1], tv, same)
	}
	return b.String(), diff
}

// TestSocketSemantics: the socket API as seen by a process traced with
// injection on (as gymtrace decides it: its start-up self-test turns
// injection off on a kernel that would misreport) equals the untraced one,
// check by check. Then, with --inject-force, the table of what injection
// itself changes on this kernel is printed, and the self-test's verdict
// must agree with it.
func TestSocketSemantics(t *testing.T) {
	needRoot(t)
	base, _ := observe(t, false)

	traced, g := observe(t, true)
	table, diff := compare(base, traced)
	g.Stop(testproc.Slow(10 * time.Second))
	decision := grepLines(g.Stderr.String(), "injection")
	t.Logf("untraced vs traced (--inject=true, all groups; gymtrace's decision: %s):\n%s", decision, table)
	if len(diff) > 0 {
		t.Errorf("%d of %d checks differ when traced (%s): a tracer must not change what the traced program sees",
			len(diff), len(base), strings.Join(diff, "; "))
	}
	injected := strings.Contains(decision, "traceparent injection on")
	// scripts/kernel-matrix-guest reads this line.
	t.Logf("conformance: %d of %d checks the same untraced and traced, injection as gymtrace decided: %s",
		len(base)-len(diff), len(base), map[bool]string{true: "on", false: "off"}[injected])
	if os.Getenv("GYMTRACE_TEST_INJECT_ON") == "1" && !injected {
		t.Errorf("GYMTRACE_TEST_INJECT_ON=1: injection must be on here as gymtrace decides it (its self-test passes on this kernel), "+
			"so that the checks ran on a socket in the sockhash; gymtrace said:\n%s", decision)
	}
	selfTestBroken := strings.Contains(decision, "misreports ioctl(FIONREAD)")

	forced, g := observe(t, true, "--inject-force")
	table, diff = compare(base, forced)
	g.Stop(testproc.Slow(10 * time.Second))
	t.Logf("untraced vs traced with --inject-force (what the injection sockhash itself changes on this kernel):\n%s", table)
	if !strings.Contains(g.Stderr.String(), "traceparent injection on") {
		t.Fatalf("--inject-force: injection did not attach:\n%s", testproc.Tail(g.Stderr.String(), 2000))
	}
	fionread := slices.ContainsFunc(diff, func(s string) bool { return strings.HasPrefix(s, "FIONREAD") })
	if fionread != selfTestBroken {
		t.Errorf("the self-test says FIONREAD broken=%v, but with injection forced FIONREAD differs=%v", selfTestBroken, fionread)
	}
	t.Logf("with injection forced, %d of %d checks differ: %s", len(diff), len(base), strings.Join(diff, "; "))
}

func grepLines(s string, words ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
