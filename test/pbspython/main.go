// Command pbspython puts python-build-standalone's CPython, the build Gym's
// `uv` installs (clang, LTO and BOLT, libpython linked into the executable,
// 3.14's tail-calling interpreter), into the Debian sid root the causality
// tests chroot into (test/python/make-root.sh sid), with Debian's
// dist-packages on its path through a .pth file: the servers then run
// Debian's uvicorn, uvloop, httptools, aiohttp and FastAPI (C extensions
// built for cp314) on Gym's interpreter.
//
//	go run . [--root /var/tmp/gymtrace-sid]     (as root; scripts/setup --tests runs it)
//
// The interpreter comes from the Go module github.com/kluctl/go-embed-python,
// which embeds the distribution (its version names CPython's and the
// python-build-standalone release). Idempotent: a finished install is marked
// with that version and left alone; anything else is replaced.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/kluctl/go-embed-python/python"
)

const (
	embedModule = "github.com/kluctl/go-embed-python"
	// Where the interpreter goes inside the root, and what the tests run.
	installDir = "/opt/python-build-standalone-3.14"
	pythonBin  = installDir + "/bin/python3.14"
	// Debian's packages for its own python3.14 (the sid root's web stack).
	distPackages = "/usr/lib/python3/dist-packages"
	pthName      = "gymtrace-debian-dist-packages.pth"
	marker       = ".gymtrace-ready"
)

// The stack's imports (test/e2e/causality_test.go, stackImports), with the
// C extensions among them built for Debian's 3.14.
const checkImports = "fastapi, uvicorn, aiohttp, yaml, itsdangerous, httptools, uvloop, uvloop.loop, httptools.parser.parser, pydantic_core._pydantic_core"

func main() {
	root := flag.String("root", envOr("GYMTRACE_SID_ROOT", "/var/tmp/gymtrace-sid"),
		"the Debian sid root (test/python/make-root.sh sid)")
	flag.Parse()
	msg, err := install(*root, moduleVersion())
	if err != nil {
		fmt.Fprintf(os.Stderr, "pbspython: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(msg)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// moduleVersion is go-embed-python's version in this build, e.g.
// v0.0.0-3.14.6-20260610-1 (CPython 3.14.6, python-build-standalone 20260610).
func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == embedModule {
				if d.Replace != nil {
					d = d.Replace
				}
				return d.Version
			}
		}
	}
	return "unknown"
}

// ready reports whether dir holds a finished install of version.
func ready(dir, version string) bool {
	b, err := os.ReadFile(filepath.Join(dir, marker))
	if err != nil || strings.TrimSpace(string(b)) != version {
		return false
	}
	st, err := os.Stat(filepath.Join(dir, "bin", "python3.14"))
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func install(root, version string) (string, error) {
	if os.Geteuid() != 0 {
		return "", errors.New("run as root: the interpreter goes into the Debian sid root and is checked under chroot")
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/python3.14")); err != nil {
		return "", fmt.Errorf("no Debian sid root with python3.14 at %s (%v): run test/python/make-root.sh sid first", root, err)
	}
	dir := filepath.Join(root, installDir)
	if ready(dir, version) {
		return fmt.Sprintf("python-build-standalone %s ready at %s", version, dir), nil
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	_, err := python.NewEmbeddedPythonWithTmpDir(tmp, false)
	os.Remove(tmp + ".lock") // the extractor's lock file beside it
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err != nil {
		return "", fmt.Errorf("extracting the embedded distribution into %s: %w", tmp, err)
	}
	// The extractor writes a symlink's target again under its name: make
	// python and python3 links again (two fewer 29 MB copies).
	for _, name := range []string{"python", "python3"} {
		p := filepath.Join(tmp, "bin", name)
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return "", err
		}
		if err := os.Symlink("python3.14", p); err != nil {
			return "", err
		}
	}
	site := filepath.Join(tmp, "lib", "python3.14", "site-packages")
	if err := os.MkdirAll(site, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(site, pthName), []byte(distPackages+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	// Debian's C extensions for 3.14 must load in this build (same cp314
	// ABI, a build with the GIL): say so plainly when they do not.
	out, err := exec.Command("chroot", root, pythonBin, "-c",
		"import sys, sysconfig; import "+checkImports+"; "+
			"print(sys.version.split()[0], sysconfig.get_config_var('SOABI'), 'free-threaded' if sysconfig.get_config_var('Py_GIL_DISABLED') else 'GIL')").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("%s in %s cannot import Debian's stack (%s) from %s: %v: %s",
			pythonBin, root, checkImports, distPackages, err, strings.TrimSpace(string(out)))
	}
	if err := os.WriteFile(filepath.Join(dir, marker), []byte(version+"\n"), 0o644); err != nil {
		return "", err
	}
	ok = true
	return fmt.Sprintf("python-build-standalone %s installed at %s (%s), Debian's dist-packages on its path",
		version, dir, strings.TrimSpace(string(out))), nil
}
