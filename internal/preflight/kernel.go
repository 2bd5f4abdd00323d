//go:build linux

package preflight

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

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
