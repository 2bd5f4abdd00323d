//go:build linux

package preflight

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Capability is one Linux capability gymtrace may use, and what for.
type Capability struct {
	Name     string
	Bit      int
	Required bool
	// Alt, when set, is a capability that grants the same (CAP_SYS_ADMIN
	// stands in for CAP_BPF and CAP_PERFMON, as on kernels before 5.8).
	Alt string
	For string // the features that use it
}

// Capabilities is gymtrace's least-privilege set, per feature. The DaemonSet in
// deploy/kubernetes grants exactly the non-SYS_ADMIN ones.
var Capabilities = []Capability{
	{Name: "CAP_BPF", Bit: unix.CAP_BPF, Required: true, Alt: "CAP_SYS_ADMIN",
		For: "load BPF programs, create maps (ring buffer, targets, gate), BTF"},
	{Name: "CAP_PERFMON", Bit: unix.CAP_PERFMON, Required: true, Alt: "CAP_SYS_ADMIN",
		For: "attach syscall tracepoints and uprobes (perf events); read kernel and user memory from BPF"},
	{Name: "CAP_SYS_PTRACE", Bit: unix.CAP_SYS_PTRACE, Required: true,
		For: "read other processes' /proc/PID/{environ,exe,maps,root} (discovery, uprobes)"},
	{Name: "CAP_DAC_READ_SEARCH", Bit: unix.CAP_DAC_READ_SEARCH,
		For: "open binaries and libraries owned by other users to place uprobes (libpython, libssl)"},
	{Name: "CAP_NET_ADMIN", Bit: unix.CAP_NET_ADMIN, Alt: "CAP_SYS_ADMIN",
		For: "attach sock_ops/sk_msg on the cgroup v2 root (traceparent injection to other hosts)"},
	{Name: "CAP_CHECKPOINT_RESTORE", Bit: unix.CAP_CHECKPOINT_RESTORE, Alt: "CAP_SYS_ADMIN",
		For: "open /proc/PID/map_files/* to attach uprobes inside containers"},
	{Name: "CAP_SYS_RESOURCE", Bit: unix.CAP_SYS_RESOURCE,
		For: "raise RLIMIT_MEMLOCK for BPF maps (only on kernels before 5.11)"},
	{Name: "CAP_SYS_ADMIN", Bit: unix.CAP_SYS_ADMIN,
		For: "mount tracefs/bpffs/securityfs when the host has not; stands in for CAP_BPF/PERFMON/NET_ADMIN"},
}

// capSet is a process's effective capability bitmap.
type capSet uint64

func (c capSet) has(bit int) bool { return c&(1<<uint(bit)) != 0 }

func (c capSet) hasName(name string) bool {
	for _, cp := range Capabilities {
		if cp.Name == name {
			return c.has(cp.Bit)
		}
	}
	return false
}

// effectiveCaps reads CapEff from a /proc/<pid>/status file.
func effectiveCaps(statusPath string) (capSet, error) {
	b, err := os.ReadFile(statusPath)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", statusPath, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing CapEff %q in %s: %w", v, statusPath, err)
			}
			return capSet(n), nil
		}
	}
	return 0, fmt.Errorf("no CapEff line in %s", statusPath)
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
