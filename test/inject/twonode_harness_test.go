//go:build linux

package inject

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/testproc"
)

const python = "/usr/bin/python3" // Debian's, with fastapi, uvicorn and aiohttp

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds gymtrace and the OTLP sink (its own module) once, or
// takes them from GYMTRACE_TEST_BIN_DIR (a guest of scripts/kernel-matrix,
// which has no writable Go cache).
func binaries(t testing.TB) (gymtrace, sink string) {
	t.Helper()
	if g := testproc.Prebuilt(t, "gymtrace"); g != "" {
		return g, testproc.Prebuilt(t, "otlpsink")
	}
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "gymtrace-inject-bin-")
		if buildErr != nil {
			return
		}
		root, _ := filepath.Abs(filepath.Join("..", ".."))
		for _, j := range []struct{ dir, out, pkg string }{
			{root, filepath.Join(binDir, "gymtrace"), "./cmd/gymtrace"},
			{filepath.Join(root, "test", "otlpsink"), filepath.Join(binDir, "otlpsink"), "."},
		} {
			cmd := exec.Command("go", "build", "-o", j.out, j.pkg)
			cmd.Dir = j.dir
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", j.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "gymtrace"), filepath.Join(binDir, "otlpsink")
}

func needStack(t testing.TB) {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2 (ip netns) to make two network namespaces")
	}
	if err := exec.Command(python, "-c", "import fastapi, uvicorn, aiohttp").Run(); err != nil {
		t.Skip("needs Debian's python3-fastapi, python3-uvicorn and python3-aiohttp under /usr/bin/python3")
	}
}

func run(t testing.TB, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// nodes makes two network namespaces joined by a veth pair: 192.0.2.1 in the
// first, 192.0.2.2 in the second (TEST-NET-1, only ever on this veth).
func nodes(t testing.TB) (a, b string) {
	t.Helper()
	tag := strconv.Itoa(os.Getpid() % 100000)
	a, b = "gtinjA"+tag, "gtinjB"+tag
	va, vb := "gtA"+tag, "gtB"+tag
	run(t, "ip", "netns", "add", a)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", a).Run() })
	run(t, "ip", "netns", "add", b)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", b).Run() })
	run(t, "ip", "link", "add", va, "type", "veth", "peer", "name", vb)
	run(t, "ip", "link", "set", va, "netns", a)
	run(t, "ip", "link", "set", vb, "netns", b)
	run(t, "ip", "-n", a, "addr", "add", "192.0.2.1/24", "dev", va)
	run(t, "ip", "-n", b, "addr", "add", "192.0.2.2/24", "dev", vb)
	for _, ns := range []string{a, b} {
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", a, "link", "set", va, "up")
	run(t, "ip", "-n", b, "link", "set", vb, "up")
	return a, b
}

type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
}

type syncBuf = testproc.Buffer

func start(t testing.TB, name string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(argv[0], argv[1:]...), out: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop(testproc.Slow(5 * time.Second)) })
	return p
}

func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) waitFor(t testing.TB, substr string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.out.String(), substr) {
		select {
		case <-p.done:
			t.Fatalf("%s exited before printing %q:\n%s", p.name, substr, tail(p.out.String()))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q in %v:\n%s", p.name, substr, d, tail(p.out.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

var freePort = testproc.FreePort
