// Package pressure samples process and host pressure from /proc, the way
// Gym's telemetry samples it inside each process (psutil): a process's CPU,
// its process tree's CPU and resident memory, and the host's memory. Gym
// samples at span boundaries; from outside a periodic sample is the natural
// form, so a Sampler is called every few seconds and each reading covers the
// interval since the last.
//
// Units are Gym's: CPU in percent of one logical core (a process busy on two
// cores reads 200), memory in MiB.
package pressure

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// userHZ is the unit of /proc's CPU times. The kernel reports them in
// USER_HZ, which is 100 on every architecture gymtrace runs on (x86-64,
// arm64) whatever the kernel's own HZ; sysconf(_SC_CLK_TCK) returns the same
// constant.
const userHZ = 100

const mib = 1 << 20

// Target is a traced process, named by its PID and start time so a reused
// PID is never taken for it.
type Target struct {
	PID       int
	StartTime uint64 // /proc/PID/stat field 22
}

// Reading is one process's pressure over the last interval.
type Reading struct {
	// CPU is the process's own CPU (every thread, user and system), in
	// percent of one logical core. Valid when HasCPU: the first sample of a
	// process has nothing to take a difference from.
	CPU    float64
	HasCPU bool
	// TreeCPU is the CPU of the process and every descendant, the ones
	// that exited during the interval included (through their parents'
	// reaped-children times). Valid when HasTreeCPU; see Sampler.
	TreeCPU    float64
	HasTreeCPU bool
	// TreeMiB is the resident memory of the process and its live
	// descendants, summed (what psutil's rss sums to).
	TreeMiB float64
}

// Host is the host's memory, in MiB.
type Host struct {
	UsedMiB, TotalMiB float64
}

// Sampler keeps the last sample of each target, to take CPU differences
// from. Not safe for concurrent use: one goroutine samples.
//
// Process tree CPU. A tree's CPU over an interval is not the sum of its
// members' differences: a child that exited moved its time into its
// parent's reaped-children time (cutime+cstime), which would then count
// all of it again. So each member m counts T(m) = utime+stime+cutime+cstime,
// and the interval's CPU is
//
//	Σ over members in both samples of T(m)now − T(m)before
//	+ Σ over members born since the last sample of T(m)now
//	− Σ over members that exited (no longer in /proc) of T(m)before
//
// an exited member's time reappears, whole, in its parent's cutime; taking
// off what it had before leaves what it used in the interval. A member
// that left the tree alive (re-parented to init when its parent exited)
// counts neither way; its CPU after leaving is not the tree's. A member
// that exited and was re-parented in the same interval would make the sum
// short; a negative sum is not reported (HasTreeCPU false), never clamped.
// /proc is not read atomically: a child reaped while the sampler reads it
// can move its time from one interval to the next (a few milliseconds of
// reading against an interval of seconds).
type Sampler struct {
	root    string
	page    uint64
	boot    func() time.Duration // CLOCK_BOOTTIME, the clock of starttime
	prev    map[Target]*sample
	buf     []byte
	procs   map[int]stat
	kids    map[int][]int
	scanned int // processes read in the last Sample (a bench figure)
}

type member struct {
	pid   int
	start uint64
}

type sample struct {
	at      time.Duration // boot time when the sample began
	self    uint64
	members map[member]uint64 // T(m)
}

// New returns a Sampler over root ("/proc" when empty).
func New(root string) *Sampler {
	if root == "" {
		root = "/proc"
	}
	return &Sampler{root: root, page: uint64(os.Getpagesize()), boot: bootTime,
		prev: map[Target]*sample{}, buf: make([]byte, 0, 1024)}
}

func bootTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Scanned is how many processes the last Sample read.
func (s *Sampler) Scanned() int { return s.scanned }

// Sample reads /proc once and returns a reading for each target that still
// runs, and the host's memory. It errs when /proc cannot be listed or its
// meminfo read; a process that exits while it is read is simply left out.
// Targets not given are forgotten.
func (s *Sampler) Sample(targets []Target) (map[Target]Reading, Host, error) {
	at := s.boot()
	host, err := s.host()
	if err != nil {
		return nil, Host{}, err
	}
	if len(targets) == 0 {
		clear(s.prev)
		return nil, host, nil
	}
	if err := s.scan(); err != nil {
		return nil, Host{}, err
	}
	out := make(map[Target]Reading, len(targets))
	next := make(map[Target]*sample, len(targets))
	for _, t := range targets {
		st, ok := s.procs[t.PID]
		if !ok || st.start != t.StartTime {
			continue // exited, or its PID is another process's now
		}
		cur := &sample{at: at, self: st.self, members: map[member]uint64{}}
		var rss uint64
		// The tree, breadth first; seen guards against a cycle a PID
		// reused during the scan could make.
		queue := []int{t.PID}
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			m := s.procs[pid]
			k := member{pid, m.start}
			if _, dup := cur.members[k]; dup {
				continue
			}
			cur.members[k] = m.self + m.reap
			rss += m.rss
			queue = append(queue, s.kids[pid]...)
		}
		r := Reading{TreeMiB: float64(rss*s.page) / mib}
		if p := s.prev[t]; p != nil && at > p.at {
			secs := (at - p.at).Seconds()
			if cur.self >= p.self { // always, for one process; checked, not assumed
				r.CPU, r.HasCPU = percent(float64(cur.self-p.self), secs), true
			}
			if d, ok := s.treeDelta(p, cur); ok {
				r.TreeCPU, r.HasTreeCPU = percent(float64(d), secs), true
			}
		}
		out[t] = r
		next[t] = cur
	}
	s.prev = next
	return out, host, nil
}

func percent(ticks, secs float64) float64 { return ticks / userHZ / secs * 100 }

// treeDelta is the tree's CPU ticks between p and cur (the type comment).
func (s *Sampler) treeDelta(p, cur *sample) (uint64, bool) {
	bornAfter := uint64(p.at / (time.Second / userHZ)) // p.at in clock ticks
	var d int64
	for m, now := range cur.members {
		if before, ok := p.members[m]; ok {
			d += int64(now) - int64(before)
		} else if m.start >= bornAfter {
			d += int64(now)
		}
		// else: an older process that joined the tree (re-parented to a
		// subreaper in it); it counts from the next interval on.
	}
	for m, before := range p.members {
		if _, ok := cur.members[m]; ok {
			continue
		}
		if st, alive := s.procs[m.pid]; alive && st.start == m.start {
			continue // left the tree alive
		}
		d -= int64(before)
	}
	if d < 0 {
		return 0, false
	}
	return uint64(d), true
}

// scan reads every process's stat, and who is whose child.
func (s *Sampler) scan() error {
	d, err := os.Open(s.root)
	if err != nil {
		return fmt.Errorf("listing processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("listing processes in %s: %w", s.root, err)
	}
	if s.procs == nil {
		s.procs, s.kids = map[int]stat{}, map[int][]int{}
	}
	clear(s.procs)
	clear(s.kids)
	s.scanned = 0
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		s.buf, err = readInto(s.root+"/"+name+"/stat", s.buf)
		if err != nil {
			continue // exited since the listing
		}
		st, err := parseStat(s.buf)
		if err != nil {
			continue // not a format this parser knows: left out, never guessed
		}
		s.scanned++
		s.procs[pid] = st
		s.kids[st.ppid] = append(s.kids[st.ppid], pid)
	}
	return nil
}

func (s *Sampler) host() (Host, error) {
	var err error
	s.buf, err = readInto(s.root+"/meminfo", s.buf)
	if err != nil {
		return Host{}, fmt.Errorf("reading the host's memory: %w", err)
	}
	m, err := parseMeminfo(s.buf)
	if err != nil {
		return Host{}, fmt.Errorf("reading %s/meminfo: %w", s.root, err)
	}
	return Host{UsedMiB: float64(m.usedKiB()) / 1024, TotalMiB: float64(m.total) / 1024}, nil
}
