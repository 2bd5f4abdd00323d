package discover

import (
	"fmt"
	"os"
	"sort"
	"strconv"
)

// Scan lists every Gym process under f.Root, sorted by PID: Python processes
// carrying Gym's config env or started by a Gym command line, in any PID
// namespace, and uvicorn workers of those. Shells and launchers that merely
// inherit the env (bash -c, uv run, a docker sandbox) are left out.
func (f *FS) Scan() ([]*Process, error) {
	snaps, err := f.readAll()
	if err != nil {
		return nil, err
	}
	var out []*Process
	for _, s := range snaps {
		if f.keep(s, snaps) {
			f.placement(s)
			out = append(out, &s.proc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

func (f *FS) readAll() (map[int]*snapshot, error) {
	ents, err := os.ReadDir(f.Root)
	if err != nil {
		return nil, fmt.Errorf("listing processes in %s: %w", f.Root, err)
	}
	snaps := make(map[int]*snapshot, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		s, err := f.read(pid)
		if err != nil {
			continue // exited meanwhile, or unreadable: not ours to report in a scan
		}
		snaps[s.proc.PID] = s
	}
	return snaps, nil
}

// keep decides whether a scanned process is a target, adopting the identity of
// a Gym parent for worker children that lack Gym's env of their own.
func (f *FS) keep(s *snapshot, all map[int]*snapshot) bool {
	if !s.python || s.tracker {
		return false
	}
	parent := all[s.proc.PPID]
	parentGym := parent != nil && parent.gym && parent.python && parent.proc.ServerName != ""
	if s.gym {
		if parentGym && parent.proc.ServerName == s.proc.ServerName {
			s.proc.Worker = true
		}
		return true
	}
	if parentGym && isSpawnChild(s.argv) {
		s.proc.ServerName = parent.proc.ServerName
		s.proc.Role = parent.proc.Role
		s.proc.Worker = true
		s.gym = true
		return true
	}
	return false
}

// match tells whether one process is a Gym target on its own, reading its
// parent when it needs to (workers without Gym env of their own).
func (f *FS) match(pid int) (*Process, bool, error) {
	s, err := f.read(pid)
	if err != nil {
		return nil, false, err
	}
	all := map[int]*snapshot{s.proc.PID: s}
	if s.python && s.proc.PPID > 0 {
		if ps, err := f.read(s.proc.PPID); err == nil {
			all[ps.proc.PID] = ps
		}
	}
	if !f.keep(s, all) {
		return &s.proc, false, nil
	}
	f.placement(s)
	return &s.proc, true, nil
}
