//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat. It is
// 100 on every Linux architecture gymtrace supports (x86-64, arm64).
const clockTicks = 100

// ProcUsage is a process's CPU so far (all threads) and its memory.
type ProcUsage struct {
	CPU      time.Duration
	RSSBytes uint64 // VmRSS now
	HWMBytes uint64 // VmHWM: peak RSS since start
}

func readProcUsage(pid int) (ProcUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcUsage{}, fmt.Errorf("reading CPU time of pid %d: %w", pid, err)
	}
	ut, st, err := parseStat(string(stat))
	if err != nil {
		return ProcUsage{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcUsage{}, fmt.Errorf("reading memory of pid %d: %w", pid, err)
	}
	rss, hwm := parseStatus(string(status))
	return ProcUsage{
		CPU:      time.Duration(ut+st) * time.Second / clockTicks,
		RSSBytes: rss,
		HWMBytes: hwm,
	}, nil
}

// parseStat returns utime and stime (fields 14 and 15) of /proc/PID/stat.
// The command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseStat(s string) (utime, stime uint64, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("unexpected /proc stat format: no ')' in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14 -> f[11].
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("unexpected /proc stat format: %d fields after the name", len(f))
	}
	if utime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parsing utime %q: %w", f[11], err)
	}
	if stime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("parsing stime %q: %w", f[12], err)
	}
	return utime, stime, nil
}

// parseStatus returns VmRSS and VmHWM of /proc/PID/status in bytes.
func parseStatus(s string) (rss, hwm uint64) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm
}

// BPFObject is one BPF program or map a process holds an fd of, from
// /proc/PID/fdinfo. The kernel keeps bpf_stats per program there, so a
// program's cost is read without any BPF syscall.
type BPFObject struct {
	ProgID    uint32
	ProgType  int
	RunTimeNs uint64
	RunCnt    uint64
	MapID     uint32
	MapType   int
}

// IsProg and IsMap say which kind of fd it was.
func (o BPFObject) IsProg() bool { return o.ProgID != 0 }
func (o BPFObject) IsMap() bool  { return o.MapID != 0 }

func parseFDInfo(s string) BPFObject {
	var o BPFObject
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "prog_id":
			o.ProgID = uint32(n)
		case "prog_type":
			o.ProgType = int(n)
		case "run_time_ns":
			o.RunTimeNs = n
		case "run_cnt":
			o.RunCnt = n
		case "map_id":
			o.MapID = uint32(n)
		case "map_type":
			o.MapType = int(n)
		}
	}
	return o
}

// bpfObjects lists the BPF programs and maps pid holds, one entry per ID
// (a process may hold several fds of one object).
func bpfObjects(pid int) (progs map[uint32]BPFObject, maps map[uint32]BPFObject, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("listing the fds of pid %d (run as root): %w", pid, err)
	}
	progs, maps = map[uint32]BPFObject{}, map[uint32]BPFObject{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(target, "anon_inode:bpf-") {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		o := parseFDInfo(string(info))
		switch {
		case o.IsProg():
			progs[o.ProgID] = o
		case o.IsMap():
			maps[o.MapID] = o
		}
	}
	return progs, maps, nil
}

// readPreemptions is how many times pid's threads were switched out while
// still runnable (nonvoluntary_ctxt_switches, summed over
// /proc/PID/task/*/status): a waking task that preempted them, or the
// tick. A thread that ended meanwhile is left out.
func readPreemptions(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("listing the threads of pid %d: %w", pid, err)
	}
	var sum uint64
	for _, e := range ents {
		status, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // the thread ended
		}
		sum += parsePreemptions(string(status))
	}
	return sum, nil
}

// parsePreemptions returns nonvoluntary_ctxt_switches of a status file.
func parsePreemptions(s string) uint64 {
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
