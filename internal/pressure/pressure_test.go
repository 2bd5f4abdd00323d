package pressure

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func statLine(pid, ppid int, comm string, utime, stime, cutime, cstime, start, rss uint64) string {
	return fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194560 100 0 0 0 %d %d %d %d 20 0 1 0 %d 123456789 %d 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n",
		pid, comm, ppid, pid, pid, utime, stime, cutime, cstime, start, rss)
}

func TestParseStat(t *testing.T) {
	st, err := parseStat([]byte(statLine(42, 7, "a) (b c) d", 11, 22, 33, 44, 555, 66)))
	if err != nil {
		t.Fatal(err)
	}
	want := stat{ppid: 7, self: 33, reap: 77, start: 555, rss: 66}
	if st != want {
		t.Fatalf("parseStat = %+v, want %+v (comm with ')' and spaces must not shift the fields)", st, want)
	}
	for name, bad := range map[string]string{
		"no comm end":   "42 (python S 7 1 1",
		"truncated":     "42 (python) S 7 1 1 0 -1 4194560 100 0 0 0 11 22",
		"negative rss":  strings.Replace(statLine(42, 7, "p", 1, 2, 3, 4, 5, 6), " 123456789 6 ", " 123456789 -6 ", 1),
		"not a number":  strings.Replace(statLine(42, 7, "p", 1, 2, 3, 4, 5, 6), " 1 2 3 4 ", " 1 x 3 4 ", 1),
		"empty":         "",
		"only the comm": "42 (p)\n",
	} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%s: parseStat(%q) took it", name, bad)
		}
	}
}

const meminfoText = `MemTotal:        8000000 kB
MemFree:         1000000 kB
MemAvailable:    5000000 kB
Buffers:          100000 kB
Cached:          2000000 kB
SwapCached:            0 kB
Active:          3000000 kB
SReclaimable:     300000 kB
SUnreclaim:       100000 kB
`

func TestParseMeminfoPsutilUsed(t *testing.T) {
	m, err := parseMeminfo([]byte(meminfoText))
	if err != nil {
		t.Fatal(err)
	}
	// psutil: total − free − buffers − (cached + sreclaimable).
	if got, want := m.usedKiB(), uint64(8000000-1000000-100000-2000000-300000); got != want {
		t.Fatalf("used = %d KiB, want %d", got, want)
	}
	odd := meminfo{total: 100, free: 10, buffers: 50, cached: 50, sreclaimable: 0}
	if got := odd.usedKiB(); got != 90 {
		t.Fatalf("used with caches larger than total − free = %d, want total − free = 90 (psutil's fallback)", got)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 8000000 kB\nMemFree: 1 kB\n")); err == nil {
		t.Fatal("a meminfo without Buffers, Cached and SReclaimable was taken")
	}
	if _, err := parseMeminfo([]byte(strings.Replace(meminfoText, "1000000 kB", "1000000 MB", 1))); err == nil {
		t.Fatal("a meminfo value not in kB was taken")
	}
}

// fakeProc is a /proc with only stat files and meminfo.
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "meminfo"), []byte(meminfoText), 0o644); err != nil {
		t.Fatal(err)
	}
	return &fakeProc{t, root}
}

func (f *fakeProc) set(pid, ppid int, utime, stime, cutime, cstime, start, rss uint64) {
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(statLine(pid, ppid, "python3", utime, stime, cutime, cstime, start, rss)), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeProc) gone(pid int) {
	if err := os.RemoveAll(filepath.Join(f.root, fmt.Sprint(pid))); err != nil {
		f.t.Fatal(err)
	}
}

// sampler returns a Sampler over f whose boot clock reads *now.
func (f *fakeProc) sampler(now *time.Duration) *Sampler {
	s := New(f.root)
	s.boot = func() time.Duration { return *now }
	return s
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestSamplerTree follows a tree through an interval in which a child used
// CPU and exited (reaped by the server), a grandchild was born, and another
// left the tree alive: the tree's CPU is exactly what its members used.
func TestSamplerTree(t *testing.T) {
	f := newFakeProc(t)
	page := float64(os.Getpagesize())
	now := 100 * time.Second // boot time: tick 10000
	s := f.sampler(&now)
	srv := Target{PID: 100, StartTime: 9000}
	f.set(100, 1, 1000, 500, 40, 10, 9000, 1000) // the server
	f.set(101, 100, 300, 100, 0, 0, 9500, 200)   // a child that will exit
	f.set(102, 101, 50, 0, 0, 0, 9600, 100)      // its child, which will be orphaned
	f.set(103, 100, 10, 0, 0, 0, 9700, 300)      // a child that keeps running
	f.set(200, 1, 99999, 0, 0, 0, 100, 999)      // not in the tree

	got, host, err := s.Sample([]Target{srv})
	if err != nil {
		t.Fatal(err)
	}
	r := got[srv]
	if r.HasCPU || r.HasTreeCPU {
		t.Fatalf("first sample %+v has CPU: there is no interval yet", r)
	}
	if want := (1000 + 200 + 100 + 300) * page / mib; !near(r.TreeMiB, want) {
		t.Fatalf("tree memory %v MiB, want %v", r.TreeMiB, want)
	}
	if !near(host.TotalMiB, 8000000.0/1024) || !near(host.UsedMiB, 4600000.0/1024) {
		t.Fatalf("host %+v", host)
	}

	// 5 s later: the server used 200+50 ticks; 101 used 20 more, exited and
	// was reaped by the server (its 300+100+20 and its own reaped 0 move
	// into the server's cutime/cstime); 102 was re-parented to init alive
	// and used 30 ticks (not the tree's); 103 used 7; 104 was born under
	// 103 and used 15.
	now += 5 * time.Second
	f.set(100, 1, 1200, 550, 40+420, 10, 9000, 1100)
	f.gone(101)
	f.set(102, 1, 80, 0, 0, 0, 9600, 100)
	f.set(103, 100, 17, 0, 0, 0, 9700, 300)
	f.set(104, 103, 15, 0, 0, 0, 10100, 50)
	got, _, err = s.Sample([]Target{srv})
	if err != nil {
		t.Fatal(err)
	}
	r = got[srv]
	if !r.HasCPU || !near(r.CPU, 250.0/100/5*100) {
		t.Fatalf("process CPU %+v, want 50 %% (250 ticks in 5 s)", r)
	}
	// 250 (server) + 20 (101's last) + 7 (103) + 15 (104) = 292 ticks.
	if !r.HasTreeCPU || !near(r.TreeCPU, 292.0/100/5*100) {
		t.Fatalf("tree CPU %+v, want %v %%", r, 292.0/5)
	}
	if want := (1100 + 300 + 50) * page / mib; !near(r.TreeMiB, want) {
		t.Fatalf("tree memory %v MiB, want %v (102 left the tree)", r.TreeMiB, want)
	}
}

// TestSamplerCanExceed100 is Gym's unit: percent of one logical core.
func TestSamplerCanExceed100(t *testing.T) {
	f := newFakeProc(t)
	now := 50 * time.Second
	s := f.sampler(&now)
	tg := Target{PID: 10, StartTime: 1}
	f.set(10, 1, 0, 0, 0, 0, 1, 1)
	if _, _, err := s.Sample([]Target{tg}); err != nil {
		t.Fatal(err)
	}
	now += 2 * time.Second
	f.set(10, 1, 300, 100, 0, 0, 1, 1) // 400 ticks in 2 s: two cores busy
	got, _, _ := s.Sample([]Target{tg})
	if r := got[tg]; !near(r.CPU, 200) || !near(r.TreeCPU, 200) {
		t.Fatalf("reading %+v, want 200 %% for two busy cores", r)
	}
}

// TestSamplerIdentity: a target whose PID now names another process gets
// no reading, and a target seen again after that starts over.
func TestSamplerIdentity(t *testing.T) {
	f := newFakeProc(t)
	now := 50 * time.Second
	s := f.sampler(&now)
	tg := Target{PID: 10, StartTime: 1}
	f.set(10, 1, 100, 0, 0, 0, 1, 1)
	s.Sample([]Target{tg})
	now += time.Second
	f.set(10, 1, 5, 0, 0, 0, 4000, 1) // PID 10 reused
	got, _, err := s.Sample([]Target{tg})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := got[tg]; ok {
		t.Fatalf("a reused PID gave the old target a reading: %+v", r)
	}
	reused := Target{PID: 10, StartTime: 4000}
	now += time.Second
	got, _, _ = s.Sample([]Target{reused})
	if r := got[reused]; r.HasCPU {
		t.Fatalf("a new process's first sample has CPU: %+v", r)
	}
}

// TestSamplerShortSum: a member that exited in an interval whose time went
// to no one in the tree would make the sum negative: nothing is reported.
func TestSamplerShortSum(t *testing.T) {
	f := newFakeProc(t)
	now := 50 * time.Second
	s := f.sampler(&now)
	tg := Target{PID: 10, StartTime: 1}
	f.set(10, 1, 10, 0, 0, 0, 1, 1)
	f.set(11, 10, 500, 0, 0, 0, 2, 1)
	s.Sample([]Target{tg})
	now += time.Second
	f.set(10, 1, 12, 0, 0, 0, 1, 1) // 11 exited, reaped elsewhere
	f.gone(11)
	got, _, _ := s.Sample([]Target{tg})
	if r := got[tg]; r.HasTreeCPU || !r.HasCPU || !near(r.CPU, 2) {
		t.Fatalf("reading %+v: want the process's 2 %% and no tree CPU", r)
	}
}

// TestSamplerThisProcess reads the real /proc: this test process is found,
// with memory, and the host has memory. (Values are the machine's; only
// their presence is checked.)
func TestSamplerThisProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	st, err := parseStat(b)
	if err != nil {
		t.Fatalf("parsing this process's stat: %v", err)
	}
	me := Target{PID: os.Getpid(), StartTime: st.start}
	s := New("")
	for i := 0; i < 2; i++ {
		got, host, err := s.Sample([]Target{me})
		if err != nil {
			t.Fatal(err)
		}
		r, ok := got[me]
		if !ok || r.TreeMiB <= 0 || host.TotalMiB <= 0 || host.UsedMiB <= 0 || host.UsedMiB > host.TotalMiB {
			t.Fatalf("sample %d: %+v (found %v), host %+v", i, r, ok, host)
		}
		if i == 1 && (!r.HasCPU || !r.HasTreeCPU || r.CPU < 0 || r.TreeCPU < r.CPU) {
			t.Fatalf("second sample %+v: want CPU, and the tree's at least the process's", r)
		}
		time.Sleep(20 * time.Millisecond) // a later boot-clock reading, not a timing assertion
	}
}

// TestSamplerReapedChild, on the real kernel: a child that used CPU and was
// reaped during the interval counts in the tree's CPU, exactly its own CPU
// time (to the clock tick), through the parent's reaped-children time.
func TestSamplerReapedChild(t *testing.T) {
	if os.Getenv("GYMTRACE_PRESSURE_SPIN") != "" {
		// The child: spin until this process has used 300 ms of CPU.
		var ru syscall.Rusage
		for x := 0; ; x++ {
			if x%100000 == 0 {
				syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				if ru.Utime.Nano()+ru.Stime.Nano() >= int64(300*time.Millisecond) {
					os.Exit(0)
				}
			}
		}
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	st, err := parseStat(b)
	if err != nil {
		t.Fatal(err)
	}
	me := Target{PID: os.Getpid(), StartTime: st.start}
	s := New("")
	first := bootTime()
	s.boot = func() time.Duration { return first }
	if _, _, err := s.Sample([]Target{me}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSamplerReapedChild$")
	cmd.Env = append(os.Environ(), "GYMTRACE_PRESSURE_SPIN=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the spinning child: %v: %s", err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	child := float64(ru.Utime.Nano()+ru.Stime.Nano()) / float64(time.Second/userHZ) // ticks
	// An interval of exactly one second on the sampler's clock: percent
	// then reads as clock ticks.
	s.boot = func() time.Duration { return first + time.Second }
	got, _, err := s.Sample([]Target{me})
	if err != nil {
		t.Fatal(err)
	}
	r := got[me]
	if !r.HasCPU || !r.HasTreeCPU {
		t.Fatalf("reading %+v: want CPU and tree CPU", r)
	}
	// The tree's time beyond this process's own is the reaped child's:
	// within 3 ticks (/proc truncates user and system time to ticks
	// separately, getrusage does not), far from the 30 a double count or a
	// lost child would make.
	if d := r.TreeCPU - r.CPU; math.Abs(d-child) > 3 {
		t.Fatalf("tree minus process = %v ticks, the child used %.1f ticks (getrusage)", d, child)
	}
	t.Logf("child: %.1f ticks by getrusage, %v ticks in the tree", child, r.TreeCPU-r.CPU)
}

// BenchmarkSample is the sampler's own cost per sample on this machine:
// one pass over every process's stat plus meminfo. Its CPU share is
// ns/op over the interval (docs/metrics.md).
func BenchmarkSample(b *testing.B) {
	st, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		b.Skip("no /proc")
	}
	me, _ := parseStat(st)
	s := New("")
	tg := []Target{{PID: os.Getpid(), StartTime: me.start}}
	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	n := 0
	for b.Loop() {
		if _, _, err := s.Sample(tg); err != nil {
			b.Fatal(err)
		}
		n++
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	// CPU, not wall time: on a loaded machine the wall time of a sample
	// includes waiting for a core.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(s.Scanned()), "procs")
}
