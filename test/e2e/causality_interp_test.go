//go:build linux

package e2e

// The interpreters TestCausality runs the stack on: the host's Python and the
// Debian roots' (chroots made by test/python/make-root.sh), each with the
// stack's imports checked before it is used.

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// What the stack imports, beyond the standard library.
const stackImports = "fastapi, uvicorn, aiohttp, yaml, itsdangerous, httptools, uvloop"

// chrootPy is a Debian root made by test/python/make-root.sh (scripts/setup
// makes both): its Python runs the stack under chroot.
type chrootPy struct {
	suite        string // "trixie"
	root, python string
	// install, when set, is how python gets into the root (it is not
	// Debian's own); what it installs runs Debian's packages of the root.
	install string
	once    sync.Once
	dir     string // test/stack inside the root, as the chroot sees it
	err     error
}

var (
	trixie = &chrootPy{suite: "trixie", root: "/var/tmp/gymtrace-trixie", python: "/usr/bin/python3.13"}
	sid    = &chrootPy{suite: "sid", root: "/var/tmp/gymtrace-sid", python: "/usr/bin/python3.14"}
	// Gym's own interpreter: python-build-standalone, what `uv` installs
	// (clang, LTO, BOLT, libpython inside the executable, 3.14's
	// tail-calling interpreter), in the sid root with Debian's 3.14
	// dist-packages on its path (test/pbspython).
	pbs = &chrootPy{suite: "sid", root: "/var/tmp/gymtrace-sid", python: "/opt/python-build-standalone-3.14/bin/python3.14",
		install: "as root: cd test/pbspython && go run . (scripts/setup --tests does)"}
)

// missing says why the root cannot run the stack, "" when it can.
func (r *chrootPy) missing() string {
	if _, err := os.Stat(filepath.Join(r.root, "usr/bin")); err != nil {
		return fmt.Sprintf("no Debian %s root at %s (%v): run test/python/make-root.sh %s as root (scripts/setup --tests does)",
			r.suite, r.root, err, r.suite)
	}
	if _, err := os.Stat(filepath.Join(r.root, r.python)); err != nil {
		if r.install != "" {
			return fmt.Sprintf("no %s in the Debian %s root %s (%v): install it %s", r.python, r.suite, r.root, err, r.install)
		}
		return fmt.Sprintf("no Debian %s root with %s at %s (%v): run test/python/make-root.sh %s as root (scripts/setup does)",
			r.suite, filepath.Base(r.python), r.root, err, r.suite)
	}
	out, err := exec.Command("chroot", r.root, r.python, "-c", "import "+stackImports).CombinedOutput()
	if err != nil && r.install != "" {
		return fmt.Sprintf("%s in the Debian %s root %s cannot import the test stack from Debian's dist-packages (needs %s): %v: %s; "+
			"reinstall it: rm -rf %s && %s",
			r.python, r.suite, r.root, stackImports, err, lastLine(out), filepath.Join(r.root, filepath.Dir(filepath.Dir(r.python))), r.install)
	}
	if err != nil {
		return fmt.Sprintf("the Debian %s root at %s cannot run the test stack (needs %s): %v: %s; "+
			"rebuild it: rm -rf %s && test/python/make-root.sh %s",
			r.suite, r.root, stackImports, err, lastLine(out), r.root, r.suite)
	}
	return ""
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// stackDir copies test/stack into the root once per test binary: the
// chrooted interpreter cannot see the repository.
func (r *chrootPy) stackDir() (string, error) {
	r.once.Do(func() {
		host, err := os.MkdirTemp(filepath.Join(r.root, "opt"), "gymstack-")
		if err != nil {
			r.err = fmt.Errorf("making a stack directory in the Debian %s root: %w", r.suite, err)
			return
		}
		sharedOwner{}.Cleanup(func() { os.RemoveAll(host) })
		if err := copyTree(filepath.Join(repoRoot, "test", "stack"), host); err != nil {
			r.err = fmt.Errorf("copying test/stack into %s: %w", host, err)
			return
		}
		r.dir = "/" + strings.TrimPrefix(host, r.root+"/")
	})
	return r.dir, r.err
}

// truthDir is a directory the chrooted servers can write and the test can
// read: the same directory under two names.
func (r *chrootPy) truthDir(t *testing.T) (host, inside string) {
	t.Helper()
	host, err := os.MkdirTemp(filepath.Join(r.root, "tmp"), "gymtrace-causality-")
	if err != nil {
		t.Fatalf("making a truth directory in the Debian %s root: %v", r.suite, err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	return host, "/" + strings.TrimPrefix(host, r.root+"/")
}

// causalityInterp is one interpreter the stack runs on.
type causalityInterp struct {
	name      string
	truthDir  func(t *testing.T) (host, inside string) // where the servers write truth, as the test and they see it
	skipCheck func() string                            // why it cannot run here, "" when it can
	root      *chrootPy                                // nil: the host's /usr/bin/python3
	// only, when set, picks the cases run on this interpreter (by stack
	// and case name): the rest are left out, not failed.
	only map[string]bool
}

// testName is the interpreter's subtest name: py3.11, py3.13, py3.14, pbs3.14.
func (py causalityInterp) testName() string {
	if py.name != "" && py.name[0] >= '0' && py.name[0] <= '9' {
		return "py" + py.name
	}
	return py.name
}

// runs says whether case c of stack sc runs on this interpreter ("" c:
// whether any case of sc does).
func (py causalityInterp) runs(sc causalityStack, c string) bool {
	if py.only == nil {
		return true
	}
	for k := range py.only {
		if st, cs, _ := strings.Cut(k, "/"); st == sc.name() && (c == "" || cs == c) {
			return true
		}
	}
	return false
}

var causalityInterps = []causalityInterp{
	{
		name: "3.11",
		truthDir: func(t *testing.T) (string, string) {
			d := t.TempDir()
			return d, d
		},
		skipCheck: func() string { return "" },
	},
	{name: "3.13", truthDir: trixie.truthDir, skipCheck: trixie.missing, root: trixie},
	{name: "3.14", truthDir: sid.truthDir, skipCheck: sid.missing, root: sid},
	// The same packages on python-build-standalone: only what the build can
	// change (where the probes sit, which copies they see), on each loop.
	{name: "pbs3.14", truthDir: pbs.truthDir, skipCheck: pbs.missing, root: pbs, only: map[string]bool{
		"httptools_uvloop_mw-responses/per_rollout_c16_n32": true,
		"httptools_asyncio_mw-all/per_rollout_c16_n32":      true,
	}},
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
