package python

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Interpreters the tests run on. The trixie root is made by
// test/python/make-trixie-root.sh.
const (
	debianPython = "/usr/bin/python3"
	trixieRoot   = "/var/tmp/gymtrace-trixie"
	trixiePython = "/usr/bin/python3.13"
	sidRoot      = "/var/tmp/gymtrace-sid"
	sidPython    = "/usr/bin/python3.14"
	// python-build-standalone's 3.14 (Gym's, through uv) in the sid root,
	// with Debian's dist-packages on its path (test/pbspython).
	pbsPython = "/opt/python-build-standalone-3.14/bin/python3.14"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: reads /proc/PID/mem of another process and loads BPF; run with go test -exec sudo")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the live tests are written for x86-64 Debian binaries")
	}
}

func testdataScript(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "test", "python", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("test script missing: %v", err)
	}
	return p
}

// pyCmd builds a command for one of the test interpreters: "debian" runs
// /usr/bin/python3 on the host, "trixie" runs python3.13 chrooted into the
// debootstrap root with the script copied in.
func pyCmd(t *testing.T, which, script string, args ...string) *exec.Cmd {
	t.Helper()
	switch which {
	case "debian":
		if _, err := os.Stat(debianPython); err != nil {
			t.Skipf("%s not installed", debianPython)
		}
		return dieWithTest(exec.Command(debianPython, append([]string{script}, args...)...))
	case "trixie":
		return rootCmd(t, trixieRoot, trixiePython, script, args...)
	case "sid":
		return rootCmd(t, sidRoot, sidPython, script, args...)
	case "pbs":
		return rootCmd(t, sidRoot, pbsPython, script, args...)
	}
	t.Fatalf("unknown interpreter %q", which)
	return nil
}

// rootCmd runs script with the interpreter of a Debian root
// (test/python/make-root.sh), chrooted.
func rootCmd(t *testing.T, root, python, script string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, python)); err != nil {
		t.Skipf("no %s in %s: run scripts/setup --tests (test/python/make-root.sh makes the root, test/pbspython puts python-build-standalone in sid)", python, root)
	}
	data, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	// A directory of its own for every process: rewriting one shared
	// /tmp/<script> in place truncated it under a process of the same test
	// that was still reading it, which then ran an empty script and exited
	// at once ("exited before listening", with no output).
	dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "gymtrace-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dst := filepath.Join(dir, filepath.Base(script))
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	inRoot := "/tmp/" + filepath.Base(dir) + "/" + filepath.Base(script)
	return dieWithTest(exec.Command("chroot", append([]string{root, python, inRoot}, args...)...))
}

// dieWithTest kills the child if the test binary dies first (a killed
// `go test` must not leave servers running).
func dieWithTest(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// started is a running test process that printed one JSON line.
type started struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startJSON starts cmd, decodes its first stdout line into v, and stops the
// process (closing stdin, then killing) when the test ends.
func startJSON(t *testing.T, cmd *exec.Cmd, v any) *started {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", cmd.Args, err)
	}
	s := &started{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	lineCh := make(chan []byte, 1)
	go func() {
		line, _ := s.out.ReadBytes('\n')
		lineCh <- line
	}()
	select {
	case line := <-lineCh:
		if err := json.Unmarshal(line, v); err != nil {
			t.Fatalf("%v printed %q: %v", cmd.Args, line, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%v printed nothing in 30 s", cmd.Args)
	}
	return s
}

func hexAddr(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		t.Fatalf("bad address %q: %v", s, err)
	}
	return v
}
