package discover

import "os"

// maxAncestry bounds DescendsFrom's walk up the process tree: a Gym server
// is a child of its orchestrator, or a grandchild through a shell or a
// uvicorn reloader.
const maxAncestry = 8

// DescendsFrom reports whether p was started by ancestor: ancestor is p's
// parent, or its parent's parent, ... within maxAncestry levels. Parents
// other than p's own are read from /proc/PID/stat.
func (f *FS) DescendsFrom(p *Process, ancestor int) bool {
	if p == nil || ancestor <= 0 {
		return false
	}
	pid := p.PPID
	for range maxAncestry {
		switch {
		case pid == ancestor:
			return true
		case pid <= 1:
			return false
		}
		b, err := os.ReadFile(f.path(pid, "stat"))
		if err != nil {
			return false
		}
		var parent Process
		if parseStat(b, &parent) != nil {
			return false
		}
		pid = parent.PPID
	}
	return false
}
