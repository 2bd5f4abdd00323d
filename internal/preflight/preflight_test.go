//go:build linux

package preflight

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: BPF loads and mounts (run `go test -exec sudo`)")
	}
}

func row(t *testing.T, r Report, feature string) Result {
	t.Helper()
	for _, x := range r {
		if x.Feature == feature {
			return x
		}
	}
	t.Fatalf("no %q row in the report", feature)
	return Result{}
}

// Here (root, Linux 6.18, lockdown=integrity) every required feature is present.
func TestRunHere(t *testing.T) {
	requireRoot(t)
	r := Run(context.Background(), Options{})
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	if !r.OK() {
		t.Fatalf("report not OK: %v", r.Err())
	}
	if err := Required(context.Background()); err != nil {
		t.Fatalf("Required: %v", err)
	}
	for _, f := range []string{"kernel", "BTF (/sys/kernel/btf/vmlinux)", "tracefs", "bpffs", "securityfs", "lockdown",
		"cgroup v2", "prog: tracepoint", "prog: raw_tracepoint", "prog: sock_ops", "prog: sk_msg", "prog: kprobe",
		"map: ringbuf", "attach: syscall tracepoint", "attach: uprobe", "attach: sock_ops (cgroup)",
		"CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE", "CAP_DAC_READ_SEARCH", "CAP_CHECKPOINT_RESTORE"} {
		x := row(t, r, f)
		if !strings.Contains(buf.String(), f) {
			t.Errorf("table lacks %q", f)
		}
		if x.Status == StatusMissing && x.Need != NeedUnused && x.Fix == "" {
			t.Errorf("%s is missing without saying what to do", f)
		}
	}
	if !strings.Contains(buf.String(), "gymtrace can run here") {
		t.Error("no verdict line")
	}
	if k := row(t, r, "prog: kprobe"); k.Status == StatusMissing && !strings.Contains(k.Detail, "gymtrace does not need it") {
		t.Errorf("kprobe row = %+v", k)
	}
}

// LoadPrograms loads gymtrace's own programs, the build this kernel gets,
// and says so in one row; forced to a build that does not exist, the row
// says what to do.
func TestProgramsRow(t *testing.T) {
	requireRoot(t)
	r := Run(context.Background(), Options{LoadPrograms: true})
	var x Result
	for _, y := range r {
		if strings.HasPrefix(y.Feature, "BPF programs (") {
			x = y
		}
	}
	if x.Status != StatusOK || !strings.Contains(x.Detail, "programs loaded and verified") {
		t.Fatalf("programs row = %+v", x)
	}
	t.Setenv("GYMTRACE_BPF_VARIANT", "nonesuch")
	x = row(t, Run(context.Background(), Options{LoadPrograms: true}), "BPF programs")
	if !x.Blocking() || !strings.Contains(x.Fix, "GYMTRACE_BPF_VARIANT") {
		t.Fatalf("programs row with a build that does not exist = %+v", x)
	}
}

func TestCapabilitiesFromStatus(t *testing.T) {
	dir := t.TempDir()
	status := filepath.Join(dir, "status")
	// Everything but CAP_BPF (39) and CAP_SYS_ADMIN (21): what capsh --drop leaves.
	eff := uint64(1<<41-1) &^ (1 << unix.CAP_BPF) &^ (1 << unix.CAP_SYS_ADMIN)
	if err := os.WriteFile(status, fmt.Appendf(nil, "Name:\tx\nCapEff:\t%016x\n", eff), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &checker{o: Options{StatusPath: status}, major: 6, minor: 1}
	c.caps, c.capsErr = effectiveCaps(status)
	c.capabilities()
	bpf := row(t, c.rep, "CAP_BPF")
	if !bpf.Blocking() || !strings.Contains(bpf.Fix, "CAP_BPF") {
		t.Errorf("CAP_BPF row = %+v", bpf)
	}
	if x := row(t, c.rep, "CAP_PERFMON"); x.Status != StatusOK {
		t.Errorf("CAP_PERFMON row = %+v", x)
	}
	if x := row(t, c.rep, "CAP_SYS_ADMIN"); x.Blocking() {
		t.Errorf("CAP_SYS_ADMIN must not be required: %+v", x)
	}
	err := c.rep.Err()
	if err == nil || !strings.Contains(err.Error(), "CAP_BPF") || strings.Contains(err.Error(), "CAP_SYS_ADMIN (") {
		t.Errorf("Err() = %v", err)
	}

	// CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON.
	c2 := &checker{caps: capSet(1 << unix.CAP_SYS_ADMIN), major: 5, minor: 4}
	c2.capabilities()
	if x := row(t, c2.rep, "CAP_BPF"); x.Status != StatusOK || !strings.Contains(x.Detail, "CAP_SYS_ADMIN") {
		t.Errorf("CAP_BPF via SYS_ADMIN = %+v", x)
	}
	// Before 5.11 RLIMIT_MEMLOCK matters.
	if x := row(t, c2.rep, "CAP_SYS_RESOURCE"); x.Need != NeedOptional || x.Status != StatusMissing {
		t.Errorf("CAP_SYS_RESOURCE on 5.4 = %+v", x)
	}
	if x := row(t, c2.rep, "CAP_SYS_PTRACE"); !x.Blocking() {
		t.Errorf("CAP_SYS_PTRACE = %+v", x)
	}
	if _, err := effectiveCaps(filepath.Join(dir, "nope")); err == nil {
		t.Error("missing status file gave no error")
	}
}

func TestLockdownMode(t *testing.T) {
	for in, want := range map[string]string{
		"none [integrity] confidentiality\n": "integrity",
		"[none] integrity confidentiality\n": "none",
		"none integrity [confidentiality]\n": "confidentiality",
		"garbage":                            "",
	} {
		if got := lockdownMode(in); got != want {
			t.Errorf("lockdownMode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCgroup2From(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, fmt.Sprint(len(s)))
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hybrid := write(`25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`)
	unified := write(`26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
30 29 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw
`)
	odd := write("40 1 0:50 / /run/my\\040cgroup rw - cgroup2 none rw\n")
	none := write("25 30 0:23 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n")
	for path, want := range map[string]string{hybrid: "/sys/fs/cgroup/unified", unified: "/sys/fs/cgroup", odd: "/run/my cgroup"} {
		if got, err := cgroup2From(path); err != nil || got != want {
			t.Errorf("cgroup2From = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := cgroup2From(none); err == nil {
		t.Error("no cgroup2 mount gave no error")
	}
}

// A tracefs that is not mounted is mounted (and so reported); with NoMount it is missing.
func TestTracefsMountedByGymtrace(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	old := tracefsPath
	tracefsPath = dir
	defer func() { tracefsPath = old }()

	c := &checker{o: Options{NoMount: true}}
	c.tracefs_()
	if x := c.rep[0]; x.Status != StatusMissing || !x.Blocking() || !strings.Contains(x.Fix, "mount -t tracefs") {
		t.Errorf("NoMount: %+v", x)
	}
	c = &checker{}
	c.tracefs_()
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if x := c.rep[0]; x.Status != StatusMounted {
		t.Fatalf("mount: %+v", x)
	}
	if !fsAt(dir, unix.TRACEFS_MAGIC) {
		t.Error("tracefs is not mounted after the check said so")
	}
}

func TestEntryOffset(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	off, err := entryOffset(exe)
	if err != nil || off == 0 {
		t.Fatalf("entryOffset(%s) = %#x, %v", exe, off, err)
	}
	if _, err := entryOffset("/etc/hostname"); err == nil {
		t.Error("a non-ELF file gave an offset")
	}
}

const helperEnv = "GYMTRACE_PREFLIGHT_HELPER"

// TestHelperRequired is not a test on its own: TestDroppedCapabilities runs the
// test binary under capsh with this one selected.
func TestHelperRequired(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper for TestDroppedCapabilities")
	}
	if err := Required(context.Background()); err != nil {
		fmt.Println("REQUIRED-ERROR:", err)
		os.Exit(3)
	}
	fmt.Println("REQUIRED-OK")
}

func capsh(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	p, err := exec.LookPath("capsh")
	if err != nil {
		t.Skip("capsh not installed (Debian: apt-get install libcap2-bin)")
	}
	return p
}

// Under `capsh --drop=cap_bpf,cap_sys_admin` Required fails and names CAP_BPF.
func TestDroppedCapabilities(t *testing.T) {
	cp := capsh(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cp, "--drop=cap_bpf,cap_sys_admin", "--", "-c", `exec "$0" -test.run='^TestHelperRequired$' -test.count=1`, exe)
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("want exit 3 from the helper, got %v", err)
	}
	if !strings.Contains(string(out), "REQUIRED-ERROR:") || !strings.Contains(string(out), "CAP_BPF") {
		t.Errorf("error does not name CAP_BPF")
	}
}

// The command itself: `gymtrace check` exits 0 here and non-zero, naming the
// capability, under capsh. Skips while cmd/gymtrace does not build yet.
func TestCheckCommand(t *testing.T) {
	cp := capsh(t)
	bin := filepath.Join(t.TempDir(), "gymtrace")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gymtrace")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("cmd/gymtrace does not build yet: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "check").CombinedOutput()
	if err != nil {
		t.Fatalf("gymtrace check as root: %v\n%s", err, out)
	}
	for _, want := range []string{"BTF", "tracefs", "lockdown", "CAP_BPF", "map: ringbuf", "attach: uprobe", "BPF programs (", "gymtrace can run here"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	out, err = exec.Command(cp, "--drop=cap_bpf,cap_sys_admin", "--", "-c", `exec "$0" check`, bin).CombinedOutput()
	t.Logf("%s", out)
	if err == nil {
		t.Fatal("gymtrace check exited 0 without CAP_BPF and CAP_SYS_ADMIN")
	}
	if !strings.Contains(string(out), "cannot run here: missing CAP_BPF") {
		t.Errorf("check does not name CAP_BPF as missing")
	}
}
