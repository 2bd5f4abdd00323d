//go:build linux

package preflight

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

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
