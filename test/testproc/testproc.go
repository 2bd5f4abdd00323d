// Package testproc runs the child processes of gymtrace's end-to-end and
// reliability tests: gymtrace itself, the Python stack, collectors. Each child
// gets its own process group, so stopping it also stops what it started, and
// its output is kept for the test to wait on and to show when it fails.
package testproc

import (
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/freeport"
)

// Buffer is an output buffer written by a copying goroutine and read by the
// test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Proc is a child process in its own process group.
type Proc struct {
	Name   string
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser
	Stdout *Buffer
	Stderr *Buffer
	Done   chan struct{} // closed when the process has exited
	Err    error         // Wait's result, once Done is closed
}

// Owner runs the cleanup that stops a process: a test, or something that
// outlives one test (processes shared by a whole package).
type Owner interface{ Cleanup(func()) }

// Options are the optional parts of Start.
type Options struct {
	Dir string
	Env []string // added to the test's environment
}

// Start starts argv as name. own stops it (SIGTERM, then SIGKILL to the
// group after 5 s) and, if own is a test that failed, logs the end of its
// stderr.
func Start(t testing.TB, own Owner, name string, argv []string, o Options) *Proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &Proc{Name: name, Cmd: cmd, Stdout: &Buffer{}, Stderr: &Buffer{}, Done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Stdout, p.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	p.Stdin = stdin
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s (%s): %v", name, strings.Join(argv, " "), err)
	}
	go func() {
		p.Err = cmd.Wait()
		close(p.Done)
	}()
	own.Cleanup(func() {
		p.Stop(5 * time.Second)
		if tt, ok := own.(testing.TB); ok && tt.Failed() {
			tt.Logf("--- %s (pid %d) stderr, last 4 KiB:\n%s", name, p.Pid(), Tail(p.Stderr.String(), 4096))
		}
	})
	return p
}

func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

func (p *Proc) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and
// always a final SIGKILL to the group so no grandchild outlives the test.
func (p *Proc) Stop(grace time.Duration) {
	pg := p.Pid()
	if !p.Exited() {
		syscall.Kill(-pg, syscall.SIGTERM)
		select {
		case <-p.Done:
		case <-time.After(grace):
		}
	}
	syscall.Kill(-pg, syscall.SIGKILL)
	p.Stdin.Close()
	<-p.Done
}

// AttachTimeout bounds how long a test waits for gymtrace to attach: a bound
// on a failure (a tracer that never attaches), not a speed asserted. Beside
// the causality suite's busy loops, syscall storm and a kernel-matrix guest
// on two CPUs, gymtrace took 60 s to load and verify its programs (ci30);
// WaitAttached logs the time when it is long.
const AttachTimeout = 5 * time.Minute

// WaitAttached waits, up to AttachTimeout, for a gymtrace process to print
// "gymtrace: attached" on stderr, logs how long it took when that was over
// 10 s, and returns the line.
func (p *Proc) WaitAttached(t testing.TB) string {
	t.Helper()
	t0 := time.Now()
	line := p.WaitOutput(t, true, "gymtrace: attached", AttachTimeout)
	if d := time.Since(t0); d > 10*time.Second {
		t.Logf("gymtrace took %v to attach", d.Round(time.Second))
	}
	return line
}

// WaitOutput waits until the process's stdout (or stderr) contains substr and
// returns the line holding it. It fails the test if the process exits first.
func (p *Proc) WaitOutput(t testing.TB, stderr bool, substr string, timeout time.Duration) string {
	t.Helper()
	buf := p.Stdout
	if stderr {
		buf = p.Stderr
	}
	deadline := time.Now().Add(timeout)
	for {
		s := buf.String()
		if i := strings.Index(s, substr); i >= 0 {
			start := strings.LastIndexByte(s[:i], '\n') + 1
			end := strings.IndexByte(s[i:], '\n')
			if end < 0 {
				end = len(s) - i
			}
			return s[start : i+end]
		}
		if p.Exited() {
			t.Fatalf("%s exited (%v) before printing %q; stderr:\n%s", p.Name, p.Err, substr, Tail(p.Stderr.String(), 4096))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no %q within %v; stdout:\n%s\nstderr:\n%s", p.Name, substr, timeout,
				Tail(p.Stdout.String(), 2048), Tail(p.Stderr.String(), 4096))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FirstLine waits for the first complete stdout line.
func (p *Proc) FirstLine(t testing.TB, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := p.Stdout.String()
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			return s[:i]
		}
		if p.Exited() {
			t.Fatalf("%s exited (%v) before printing a line; stderr:\n%s", p.Name, p.Err, Tail(p.Stderr.String(), 4096))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no line within %v; stderr:\n%s", p.Name, timeout, Tail(p.Stderr.String(), 4096))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Tail is the last n bytes of s, marked as cut when it is.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago, outside
// the kernel's ephemeral range so that no outbound connection takes it before
// the server binds it (see package freeport).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// OpenELF opens the ELF file at path for the test, which closes it; a
// file that is not there skips the test (the Python roots are built by
// scripts/setup --tests).
func OpenELF(t testing.TB, path string) *elf.File {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s is not here (scripts/setup --tests builds the Python roots): %v", path, err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Slow scales a test's waits for a slow machine: GYMTRACE_TEST_TIME_SCALE
// (a factor, default 1; scripts/kernel-matrix-guest sets 10 under QEMU's
// TCG). Deadlines only: they bound how long a test waits for something, no
// test asserts that anything took less.
func Slow(d time.Duration) time.Duration {
	f, err := strconv.ParseFloat(os.Getenv("GYMTRACE_TEST_TIME_SCALE"), 64)
	if err != nil || f < 1 {
		return d
	}
	return time.Duration(float64(d) * f)
}

// Prebuilt is the binary name from GYMTRACE_TEST_BIN_DIR, where a test run
// without a writable Go cache (a QEMU guest of scripts/kernel-matrix) finds
// what it would otherwise `go build`; "" when that variable is not set.
func Prebuilt(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("GYMTRACE_TEST_BIN_DIR")
	if dir == "" {
		return ""
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("GYMTRACE_TEST_BIN_DIR=%s has no %s: %v", dir, name, err)
	}
	return p
}
