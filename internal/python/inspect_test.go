package python

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

type threadsReport struct {
	Version string            `json:"version"`
	Main    uint64            `json:"main"`
	Threads map[string]string `json:"threads"`
}

// checkLiveWalk starts threads_ctx.py, inspects the process and proves the
// offsets: every Python thread is found by its native id and a thread blocked
// inside ctx.run(...) has exactly that Context as tstate->context.
func checkLiveWalk(t *testing.T, cmd *exec.Cmd, wantMinor int) *Interpreter {
	var rep threadsReport
	startJSON(t, cmd, &rep)
	pid := cmd.Process.Pid
	// chroot execs python in place, so the pid is the interpreter's.
	in, err := InspectInterpreter(pid)
	if err != nil {
		t.Fatalf("Inspect(%d): %v", pid, err)
	}
	t.Logf("pid %d: CPython %s in %s (shared=%v bias=%#x) params %+v", pid, in.Version, in.MappedPath, in.Shared, in.Bias, in.Params)
	if in.Version.Minor != wantMinor || !strings.HasPrefix(rep.Version, in.Version.String()[:4]) {
		t.Fatalf("version %s, process says %s", in.Version, rep.Version)
	}
	threads, err := Walk(pid, in.Params)
	if err != nil {
		t.Fatal(err)
	}
	byTID := map[uint64]Thread{}
	for _, th := range threads {
		byTID[th.NativeTID] = th
	}
	if _, ok := byTID[rep.Main]; !ok {
		t.Errorf("main thread %d not found by the walk (%d thread states)", rep.Main, len(threads))
	}
	for tidS, ctxS := range rep.Threads {
		tid, _ := strconv.ParseUint(tidS, 10, 64)
		th, ok := byTID[tid]
		if !ok {
			t.Errorf("thread %d not found by the walk", tid)
			continue
		}
		if want := hexAddr(t, ctxS); th.Context != want || !th.ContextOK {
			t.Errorf("thread %d: walk read context %#x (PyContext=%v), Python says %#x", tid, th.Context, th.ContextOK, want)
		}
	}
	if len(rep.Threads) == 0 {
		t.Fatal("script reported no threads")
	}
	return in
}

func TestInspectDebian311(t *testing.T) {
	requireRoot(t)
	cmd := pyCmd(t, "debian", testdataScript(t, "threads_ctx.py"), "3")
	in := checkLiveWalk(t, cmd, 11)
	if in.Shared || in.Bias != 0 {
		t.Errorf("Debian's python3.11 is a non-PIE executable with a static libpython; got shared=%v bias=%#x", in.Shared, in.Bias)
	}
}

func TestInspectTrixie313(t *testing.T) {
	requireRoot(t)
	cmd := pyCmd(t, "trixie", testdataScript(t, "threads_ctx.py"), "4")
	checkLiveWalk(t, cmd, 13)
}

// python-build-standalone's 3.14 (what uv installs for Gym): libpython is
// linked into the stripped, non-PIE executable (the libpython3.14.so beside
// it is for embedders and is not mapped), so the runtime is found in the
// executable's .dynsym with no bias.
func TestInspectPBS314(t *testing.T) {
	requireRoot(t)
	cmd := pyCmd(t, "pbs", testdataScript(t, "threads_ctx.py"), "4")
	in := checkLiveWalk(t, cmd, 14)
	if in.Shared || in.Bias != 0 || !strings.HasSuffix(in.MappedPath, "/bin/python3.14") {
		t.Errorf("python-build-standalone's python3.14 is a non-PIE executable with libpython linked in; got %s shared=%v bias=%#x",
			in.MappedPath, in.Shared, in.Bias)
	}
}

// A venv with a copied interpreter has a different path and name than the
// system one (venv --copies); symlinked venvs resolve to it anyway.
func TestInspectVenvCopy(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command(debianPython, "-m", "venv", "--without-pip", "--copies", filepath.Join(dir, "venv")).CombinedOutput(); err != nil {
		t.Skipf("python3 -m venv unavailable (python3-venv not installed?): %v: %s", err, out)
	}
	py := filepath.Join(dir, "venv", "bin", "python")
	cmd := dieWithTest(exec.Command(py, testdataScript(t, "threads_ctx.py"), "2"))
	checkLiveWalk(t, cmd, 11)
}

// pyenv builds (when present) link a shared libpython: the runtime is in a
// PIC shared object with a load bias. Covers 3.11, 3.12 and 3.13 layouts.
func TestInspectSharedLibpython(t *testing.T) {
	requireRoot(t)
	home, _ := os.UserHomeDir()
	found := 0
	for _, v := range []struct {
		dir   string
		minor int
	}{{"3.11.7", 11}, {"3.12.1", 12}, {"3.13.0", 13}} {
		py := filepath.Join(home, ".pyenv", "versions", v.dir, "bin", "python3")
		if _, err := os.Stat(py); err != nil {
			continue
		}
		found++
		t.Run(v.dir, func(t *testing.T) {
			in := checkLiveWalk(t, dieWithTest(exec.Command(py, testdataScript(t, "threads_ctx.py"), "2")), v.minor)
			if !in.Shared || in.Bias == 0 {
				t.Errorf("expected a shared libpython with a load bias, got %s shared=%v bias=%#x", in.MappedPath, in.Shared, in.Bias)
			}
		})
	}
	if found == 0 {
		t.Skip("no pyenv CPython builds under ~/.pyenv/versions")
	}
}

func TestInspectNotPython(t *testing.T) {
	requireRoot(t)
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if _, err := Inspect(cmd.Process.Pid); !errors.Is(err, ErrNotPython) {
		t.Fatalf("Inspect(sleep) = %v, want ErrNotPython", err)
	}
}
