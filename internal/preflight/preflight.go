//go:build linux

// Package preflight checks, before anything is attached, that this machine and
// this process can run gymtrace: kernel features, mounts, lockdown and
// capabilities. `gymtrace check` prints the table; the tracer calls Required.
package preflight

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Status of one feature.
type Status string

const (
	StatusOK      Status = "ok"
	StatusMounted Status = "mounted-by-gymtrace"
	StatusMissing Status = "missing"
)

// Need says what a missing feature costs.
type Need string

const (
	NeedRequired Need = "required" // gymtrace does not start without it
	NeedOptional Need = "optional" // a feature is off without it
	NeedUnused   Need = "unused"   // listed for completeness; gymtrace does not use it
)

// Result is one row of the table.
type Result struct {
	Feature string
	Status  Status
	Need    Need
	Detail  string // what was found
	Fix     string // what to do, when missing
}

// Blocking reports a required feature that is missing.
func (r Result) Blocking() bool { return r.Status == StatusMissing && r.Need == NeedRequired }

// Report is the outcome of Run, in check order.
type Report []Result

// OK is true when no required feature is missing.
func (r Report) OK() bool { return len(r.Blocking()) == 0 }

// Blocking lists the required features that are missing.
func (r Report) Blocking() []Result {
	var out []Result
	for _, x := range r {
		if x.Blocking() {
			out = append(out, x)
		}
	}
	return out
}

// Err is nil when r.OK(), else one error naming every missing required feature
// and what to do about it.
func (r Report) Err() error {
	b := r.Blocking()
	if len(b) == 0 {
		return nil
	}
	capMissing := false
	for _, x := range b {
		capMissing = capMissing || strings.HasPrefix(x.Feature, "CAP_")
	}
	var parts []string
	for _, x := range b {
		// Rows that fail only for want of a capability already named say nothing new.
		if capMissing && strings.HasPrefix(x.Fix, "needs CAP_") {
			continue
		}
		parts = append(parts, x.Feature+" ("+x.Fix+")")
	}
	return fmt.Errorf("gymtrace cannot trace on this machine: missing %s; run `gymtrace check` for the full table", strings.Join(parts, "; "))
}

// Options tunes Run.
type Options struct {
	// NoMount leaves tracefs, bpffs and securityfs alone instead of mounting them.
	NoMount bool
	// Traceparent makes sock_ops/sk_msg and CAP_NET_ADMIN required (traceparent
	// injection into requests to other hosts is enabled).
	Traceparent bool
	// StatusPath is the status file whose CapEff is checked (default /proc/self/status).
	StatusPath string
	// InjectSelfTest, when set, runs injection's start-up self-test
	// (inject.SelfTest): safe is false where injection would change what
	// the traced programs see, and detail says what.
	InjectSelfTest func() (safe bool, detail string, err error)
}

// Required runs the checks the tracer needs, mounting what it can, and returns
// Report.Err. Call it before attaching anything.
func Required(ctx context.Context) error {
	return Run(ctx, Options{}).Err()
}

// Paths checked; variables so tests can point at fakes.
var (
	btfPath        = "/sys/kernel/btf/vmlinux"
	tracefsPath    = "/sys/kernel/tracing"
	debugTracePath = "/sys/kernel/debug/tracing"
	bpffsPath      = "/sys/fs/bpf"
	securityfsPath = "/sys/kernel/security"
	mountinfoPath  = "/proc/self/mountinfo"
)

type checker struct {
	o       Options
	caps    capSet
	capsErr error
	major   int
	minor   int
	release string
	tracefs string // where tracefs is, "" if nowhere
	rep     Report
}

func (c *checker) add(r Result) { c.rep = append(c.rep, r) }

// Run performs every check and returns the rows. It never fails as a whole: a
// check that cannot run is a missing row saying why.
func Run(ctx context.Context, o Options) Report {
	if o.StatusPath == "" {
		o.StatusPath = "/proc/self/status"
	}
	c := &checker{o: o}
	c.caps, c.capsErr = effectiveCaps(o.StatusPath)
	steps := []func(){
		c.kernel, c.btf, c.capabilities, c.tracefs_, c.bpffs, c.lockdown, c.cgroup2,
		c.progTypes, c.maps, c.tracepointAttach, c.uprobeAttach, c.sockOpsAttach, c.injectSelfTest,
	}
	for _, step := range steps {
		if ctx.Err() != nil {
			c.add(Result{Feature: "preflight", Status: StatusMissing, Need: NeedRequired,
				Detail: ctx.Err().Error(), Fix: "the check was interrupted; run it again"})
			break
		}
		step()
	}
	return c.rep
}

func (c *checker) kernel() {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		c.add(Result{Feature: "kernel", Status: StatusMissing, Need: NeedRequired, Detail: err.Error(),
			Fix: "uname(2) failed; this is not a Linux kernel gymtrace can use"})
		return
	}
	c.release = unix.ByteSliceToString(u.Release[:])
	fmt.Sscanf(c.release, "%d.%d", &c.major, &c.minor)
	r := Result{Feature: "kernel", Need: NeedRequired, Detail: "Linux " + c.release + " " + unix.ByteSliceToString(u.Machine[:])}
	if c.atLeast(5, 8) {
		r.Status = StatusOK
	} else {
		r.Status = StatusMissing
		r.Fix = "Linux 5.8 or newer is needed (BPF ring buffer, CAP_BPF); upgrade the kernel"
	}
	c.add(r)
}

func (c *checker) atLeast(major, minor int) bool {
	return c.major > major || c.major == major && c.minor >= minor
}

func (c *checker) btf() {
	r := Result{Feature: "BTF (" + btfPath + ")", Need: NeedRequired}
	if _, err := os.Stat(btfPath); err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "gymtrace's programs are CO-RE and need kernel BTF: use a kernel built with CONFIG_DEBUG_INFO_BTF=y (Debian 12's backports kernel, Ubuntu 20.10+, RHEL 8.2+)"
		c.add(r)
		return
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "the kernel's BTF could not be parsed; check that " + btfPath + " is readable"
		c.add(r)
		return
	}
	n := 0
	for range spec.All() {
		n++
	}
	r.Status, r.Detail = StatusOK, fmt.Sprintf("%d types", n)
	c.add(r)
}

func (c *checker) capabilities() {
	if c.capsErr != nil {
		c.add(Result{Feature: "capabilities", Status: StatusMissing, Need: NeedRequired, Detail: c.capsErr.Error(),
			Fix: "cannot read this process's capabilities; is /proc mounted?"})
		return
	}
	for _, cp := range Capabilities {
		need := NeedOptional
		if cp.Required || cp.Name == "CAP_NET_ADMIN" && c.o.Traceparent {
			need = NeedRequired
		}
		r := Result{Feature: cp.Name, Need: need, Detail: cp.For}
		switch {
		case c.caps.has(cp.Bit):
			r.Status = StatusOK
		case cp.Alt != "" && c.caps.hasName(cp.Alt):
			r.Status, r.Detail = StatusOK, "granted through "+cp.Alt+"; "+cp.For
		case cp.Name == "CAP_SYS_RESOURCE" && c.atLeast(5, 11):
			r.Status, r.Need = StatusMissing, NeedUnused
			r.Detail = "not needed on Linux 5.11+ (BPF memory is charged to the cgroup, not RLIMIT_MEMLOCK)"
		default:
			r.Status = StatusMissing
			alt := ""
			if cp.Alt != "" {
				alt = " (or " + cp.Alt + ")"
			}
			r.Fix = fmt.Sprintf("grant %s%s: run as root, or `setcap %s+ep gymtrace`, or add %s to the container's securityContext.capabilities.add",
				cp.Name, alt, strings.ToLower(cp.Name), strings.TrimPrefix(cp.Name, "CAP_"))
		}
		c.add(r)
	}
}

// fsAt reports whether a filesystem with the given magic is mounted at path.
func fsAt(path string, magic int64) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && int64(st.Type) == magic
}

// ensureMounted checks a pseudo filesystem and mounts it when missing and allowed.
func (c *checker) ensureMounted(feature, fstype, path string, magic int64, need Need, use string) Result {
	r := Result{Feature: feature, Need: need, Detail: path + ": " + use}
	if fsAt(path, magic) {
		r.Status = StatusOK
		return r
	}
	if !c.o.NoMount {
		err := unix.Mount(fstype, path, fstype, 0, "")
		if err == nil && fsAt(path, magic) {
			r.Status = StatusMounted
			return r
		}
		if err != nil {
			r.Detail = fmt.Sprintf("%s: mounting %s failed: %v", path, fstype, err)
		}
	}
	r.Status = StatusMissing
	r.Fix = fmt.Sprintf("mount it: `mount -t %s %s %s` (needs CAP_SYS_ADMIN), or in a pod mount the host's %s (hostPath)", fstype, fstype, path, path)
	return r
}

func (c *checker) tracefs_() {
	// The debugfs-era location is fine if the host has only that.
	if fsAt(debugTracePath, unix.TRACEFS_MAGIC) && !fsAt(tracefsPath, unix.TRACEFS_MAGIC) {
		c.tracefs = debugTracePath
		c.add(Result{Feature: "tracefs", Status: StatusOK, Need: NeedRequired, Detail: debugTracePath + ": syscall tracepoint ids, uprobe events"})
		return
	}
	r := c.ensureMounted("tracefs", "tracefs", tracefsPath, unix.TRACEFS_MAGIC, NeedRequired, "syscall tracepoint ids, uprobe events")
	if r.Status != StatusMissing {
		c.tracefs = tracefsPath
	}
	c.add(r)
}

func (c *checker) bpffs() {
	c.add(c.ensureMounted("bpffs", "bpf", bpffsPath, unix.BPF_FS_MAGIC, NeedOptional, "pinned maps for several gymtrace instances and bpftool inspection"))
}

func (c *checker) lockdown() {
	r := c.ensureMounted("securityfs", "securityfs", securityfsPath, unix.SECURITYFS_MAGIC, NeedOptional, "to read the lockdown mode")
	c.add(r)
	lr := Result{Feature: "lockdown", Need: NeedRequired}
	if r.Status == StatusMissing {
		lr.Status, lr.Need = StatusMissing, NeedOptional
		lr.Detail = "unknown: securityfs is not mounted"
		lr.Fix = "mount securityfs so the lockdown mode can be checked; under lockdown=confidentiality gymtrace cannot read kernel memory"
		c.add(lr)
		return
	}
	b, err := os.ReadFile(securityfsPath + "/lockdown")
	if errors.Is(err, os.ErrNotExist) {
		lr.Status, lr.Detail = StatusOK, "the lockdown LSM is not enabled"
		c.add(lr)
		return
	}
	if err != nil {
		lr.Status, lr.Need, lr.Detail = StatusMissing, NeedOptional, err.Error()
		lr.Fix = "cannot read the lockdown mode; under lockdown=confidentiality gymtrace cannot read kernel memory"
		c.add(lr)
		return
	}
	mode := lockdownMode(string(b))
	switch mode {
	case "none":
		lr.Status, lr.Detail = StatusOK, "none"
	case "integrity":
		lr.Status, lr.Detail = StatusOK, "integrity: bpf_probe_write_user is refused (gymtrace does not use it); kernel and user reads work"
	case "confidentiality":
		lr.Status, lr.Detail = StatusMissing, "confidentiality: BPF reads of kernel memory (bpf_probe_read_kernel, CO-RE reads of sockets and tasks) are refused"
		lr.Fix = "boot with lockdown=integrity (or none), or turn off Secure Boot's confidentiality lockdown"
	default:
		lr.Status, lr.Need, lr.Detail = StatusMissing, NeedOptional, "unrecognised: "+strings.TrimSpace(string(b))
		lr.Fix = "check " + securityfsPath + "/lockdown by hand"
	}
	c.add(lr)
}

// lockdownMode picks the bracketed mode out of "none [integrity] confidentiality".
func lockdownMode(s string) string {
	i := strings.IndexByte(s, '[')
	j := strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

// CgroupV2Path returns where the cgroup v2 hierarchy is mounted, preferring
// /sys/fs/cgroup, then /sys/fs/cgroup/unified (hybrid hosts), then any.
func CgroupV2Path() (string, error) { return cgroup2From(mountinfoPath) }

func cgroup2From(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	var found []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		// "36 35 0:30 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		if pf := strings.Fields(post); len(pf) == 0 || pf[0] != "cgroup2" {
			continue
		}
		if fields := strings.Fields(pre); len(fields) >= 5 {
			found = append(found, unescapeMount(fields[4]))
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading %s: %w", mountinfo, err)
	}
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, p := range found {
			if p == want {
				return p, nil
			}
		}
	}
	if len(found) > 0 {
		return found[0], nil
	}
	return "", errors.New("no cgroup2 filesystem is mounted")
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func (c *checker) cgroup2() {
	need := NeedOptional
	if c.o.Traceparent {
		need = NeedRequired
	}
	p, err := CgroupV2Path()
	if err != nil {
		c.add(Result{Feature: "cgroup v2", Status: StatusMissing, Need: need, Detail: err.Error(),
			Fix: "mount it (`mount -t cgroup2 none /sys/fs/cgroup/unified`) or, in a pod, mount the host's /sys/fs/cgroup; sock_ops/sk_msg (traceparent injection) attach there"})
		return
	}
	c.add(Result{Feature: "cgroup v2", Status: StatusOK, Need: need, Detail: p + ": sock_ops/sk_msg attach point"})
}

func (c *checker) bpfFix() string {
	if !c.caps.has(unix.CAP_BPF) && !c.caps.has(unix.CAP_SYS_ADMIN) {
		return "needs CAP_BPF (see the capability rows)"
	}
	return ""
}

// probeRow turns a cilium/ebpf feature probe into a row.
func (c *checker) probeRow(feature string, need Need, use string, err error, fix string) Result {
	r := Result{Feature: feature, Need: need, Detail: use}
	switch {
	case err == nil:
		r.Status = StatusOK
	case errors.Is(err, ebpf.ErrNotSupported):
		r.Status, r.Detail = StatusMissing, "not supported by this kernel"
		r.Fix = fix
	default:
		r.Status, r.Detail = StatusMissing, err.Error()
		if f := c.bpfFix(); f != "" {
			r.Fix = f
		} else {
			r.Fix = fix
		}
	}
	return r
}

func (c *checker) progTypes() {
	traceNeed := NeedOptional
	if c.o.Traceparent {
		traceNeed = NeedRequired
	}
	c.add(c.probeRow("prog: tracepoint", NeedRequired, "syscall tracepoints (HTTP capture)",
		features.HaveProgramType(ebpf.TracePoint), "enable CONFIG_BPF_EVENTS in the kernel"))
	c.add(c.probeRow("prog: raw_tracepoint", NeedOptional, "process exec/fork/exit events",
		features.HaveProgramType(ebpf.RawTracepoint), "enable CONFIG_BPF_EVENTS; without it new processes are found by rescans only"))
	c.add(c.probeRow("prog: sock_ops", traceNeed, "traceparent injection: connections into the sockhash",
		features.HaveProgramType(ebpf.SockOps), "enable CONFIG_CGROUP_BPF; traceparent is then not injected into requests to other hosts"))
	c.add(c.probeRow("prog: sk_msg", traceNeed, "traceparent injection: bpf_msg_push_data",
		features.HaveProgramType(ebpf.SkMsg), "enable CONFIG_BPF_STREAM_PARSER; traceparent is then not injected"))
	c.add(c.probeRow("prog: cgroup_skb", NeedUnused, "cgroup programs (not attached by gymtrace)",
		features.HaveProgramType(ebpf.CGroupSKB), "gymtrace does not need it"))

	// Kprobes: listed because other tracers need them; gymtrace does not.
	r := Result{Feature: "prog: kprobe", Need: NeedUnused}
	err := features.HaveProgramType(ebpf.Kprobe)
	_, evErr := os.Stat(c.tracefsOr(tracefsPath) + "/kprobe_events")
	switch {
	case err == nil && evErr == nil:
		r.Status, r.Detail = StatusOK, "available (gymtrace does not need it)"
	case err == nil:
		r.Status, r.Detail = StatusMissing, "not available: the kernel has no kprobe_events (CONFIG_KPROBES off); gymtrace does not need it"
	default:
		r.Status, r.Detail = StatusMissing, "not available: gymtrace does not need it"
	}
	c.add(r)
}

func (c *checker) tracefsOr(def string) string {
	if c.tracefs != "" {
		return c.tracefs
	}
	return def
}

func (c *checker) maps() {
	c.add(c.probeRow("map: ringbuf", NeedRequired, "event delivery to userspace",
		features.HaveMapType(ebpf.RingBuf), "Linux 5.8+ is needed for BPF_MAP_TYPE_RINGBUF"))
	c.add(c.probeRow("map: lru_hash", NeedRequired, "per-connection state",
		features.HaveMapType(ebpf.LRUHash), "Linux 4.10+ is needed for LRU hash maps"))
	need := NeedOptional
	if c.o.Traceparent {
		need = NeedRequired
	}
	c.add(c.probeRow("map: sockhash", need, "traceparent injection (sk_msg attach point)",
		features.HaveMapType(ebpf.SockHash), "enable CONFIG_BPF_STREAM_PARSER"))
}

// trivial returns a program that does nothing, of the given type.
func trivial(pt ebpf.ProgramType, ret int32) (*ebpf.Program, error) {
	return ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name:         "gt_preflight",
		Type:         pt,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()},
	}, ebpf.ProgramOptions{LogDisabled: true})
}

func (c *checker) tracepointAttach() {
	r := Result{Feature: "attach: syscall tracepoint", Need: NeedRequired, Detail: "syscalls/sys_enter_write, loaded, attached and detached"}
	err := func() error {
		prog, err := trivial(ebpf.TracePoint, 0)
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := link.Tracepoint("syscalls", "sys_enter_write", prog, nil)
		if err != nil {
			return fmt.Errorf("attaching: %w", err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = c.attachFix("CONFIG_FTRACE_SYSCALLS (syscall tracepoints) and a mounted tracefs")
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}

func (c *checker) attachFix(kernel string) string {
	if f := c.bpfFix(); f != "" {
		return f
	}
	if !c.caps.has(unix.CAP_PERFMON) && !c.caps.has(unix.CAP_SYS_ADMIN) {
		return "needs CAP_PERFMON (see the capability rows)"
	}
	return "the kernel needs " + kernel
}

func (c *checker) uprobeAttach() {
	r := Result{Feature: "attach: uprobe", Need: NeedRequired, Detail: "/proc/self/exe entry point, loaded, attached and detached"}
	err := func() error {
		exe, err := os.Executable()
		if err != nil {
			exe = "/proc/self/exe"
		}
		off, err := entryOffset(exe)
		if err != nil {
			return err
		}
		ex, err := link.OpenExecutable(exe)
		if err != nil {
			return fmt.Errorf("opening %s: %w", exe, err)
		}
		prog, err := trivial(ebpf.Kprobe, 0) // uprobes are kprobe-type programs
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := ex.Uprobe("", prog, &link.UprobeOptions{Address: off, PID: os.Getpid()})
		if err != nil {
			return fmt.Errorf("attaching: %w", err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = c.attachFix("CONFIG_UPROBE_EVENTS (Python context, TLS)")
		if c.bpfFix() == "" && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) && !c.caps.has(unix.CAP_SYS_ADMIN) {
			// Measured on Linux 6.18: CAP_PERFMON and CAP_BPF are not
			// enough for a uprobe perf event (docs/security.md).
			r.Fix = "this kernel refuses uprobe perf events without CAP_SYS_ADMIN: grant it (or run privileged)"
		}
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}

// entryOffset is the file offset of an ELF's entry point: a valid uprobe site
// even in a stripped binary.
func entryOffset(path string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("reading ELF %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && f.Entry >= p.Vaddr && f.Entry < p.Vaddr+p.Filesz {
			return f.Entry - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("%s: entry point %#x is in no executable segment", path, f.Entry)
}

func (c *checker) sockOpsAttach() {
	need := NeedOptional
	if c.o.Traceparent {
		need = NeedRequired
	}
	r := Result{Feature: "attach: sock_ops (cgroup)", Need: need}
	cg, err := CgroupV2Path()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "mount cgroup v2 (see the cgroup v2 row)"
		c.add(r)
		return
	}
	r.Detail = cg + ", loaded, attached and detached"
	err = func() error {
		prog, err := trivial(ebpf.SockOps, 1)
		if err != nil {
			return fmt.Errorf("loading: %w", err)
		}
		defer prog.Close()
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: prog})
		if err != nil {
			return fmt.Errorf("attaching to %s: %w", cg, err)
		}
		return l.Close()
	}()
	if err != nil {
		r.Status, r.Detail = StatusMissing, err.Error()
		switch {
		case c.bpfFix() != "":
			r.Fix = c.bpfFix()
		case !c.caps.has(unix.CAP_NET_ADMIN) && !c.caps.has(unix.CAP_SYS_ADMIN):
			r.Fix = "needs CAP_NET_ADMIN (see the capability rows); traceparent is then not injected into requests to other hosts"
		default:
			r.Fix = "the kernel needs CONFIG_CGROUP_BPF; traceparent is then not injected into requests to other hosts"
		}
	} else {
		r.Status = StatusOK
	}
	c.add(r)
}

// injectSelfTest: does a socket in a sockhash report its state as it does
// outside one? Where not, gymtrace keeps traceparent injection off.
func (c *checker) injectSelfTest() {
	if c.o.InjectSelfTest == nil {
		return
	}
	r := Result{Feature: "injection self-test (sockhash)", Need: NeedOptional}
	safe, detail, err := c.o.InjectSelfTest()
	switch {
	case err != nil:
		r.Status, r.Detail = StatusMissing, err.Error()
		r.Fix = "needs CAP_BPF and CAP_NET_ADMIN (see the capability rows); gymtrace keeps traceparent injection off when it cannot run this test"
	case !safe:
		r.Status, r.Detail = StatusMissing, detail
		r.Fix = "gymtrace keeps traceparent injection off here (traces do not join across nodes); a kernel with the fix, " +
			"or --inject-force to inject and let the traced programs see the misreport"
	default:
		r.Status, r.Detail = StatusOK, detail
	}
	c.add(r)
}

// WriteTable prints the report as an aligned table and a closing verdict.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tSTATUS\tNEED\tDETAIL / WHAT TO DO")
	for _, x := range r {
		text := x.Detail
		if x.Status == StatusMissing && x.Fix != "" {
			text += " -> " + x.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.Feature, x.Status, x.Need, text)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var err error
	if b := r.Blocking(); len(b) > 0 {
		names := make([]string, len(b))
		for i, x := range b {
			names[i] = x.Feature
		}
		_, err = fmt.Fprintf(w, "\ngymtrace cannot run here: missing %s\n", strings.Join(names, ", "))
	} else {
		_, err = fmt.Fprintln(w, "\ngymtrace can run here: every required feature is present")
	}
	return err
}
