//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// loopKinds are the syscalls the untargeted loop times. write/read/sendto/
// recvfrom are on gymtrace's hooks; getppid is on none, and shows what any
// attached syscall tracepoint costs every other syscall (the kernel then
// takes the tracing slow path for all of them).
var loopKinds = []string{"write", "read", "sendto+recvfrom", "getppid"}

// trapKind is the loop's call of trapTarget: a few ns bare, the price of a
// uprobe hit (or of a uprobe and its return probe) in the uprobe modes.
// gymtrace's asyncio-parent probes pay it on every context copy, outside
// bpf_stats, and it depends on the host far more than a syscall does
// (exceptions, page-table isolation): the tax phase measures it.
const trapKind = "uprobe target call"

// runLoop is the `gtbench loop` child: a process gymtrace does not target,
// timing raw syscalls. RawSyscall skips the Go scheduler's hooks, so the
// figure is the kernel's plus a few ns of call overhead, equal in every mode.
// It prints {"kind": ns per syscall} as JSON.
func runLoop(args []string) error {
	iters := 200000
	batches := 20
	if len(args) > 0 {
		n, err := strconv.Atoi(args[0])
		if err != nil || n < batches {
			return fmt.Errorf("loop: iterations %q: want a number >= %d", args[0], batches)
		}
		iters = n
	}
	runtime.LockOSThread()
	null, err := unix.Open("/dev/null", unix.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/null: %w", err)
	}
	zero, err := unix.Open("/dev/zero", unix.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/zero: %w", err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	buf := make([]byte, 64)
	p := uintptr(unsafe.Pointer(&buf[0]))
	one := func(kind string) (calls int) {
		switch kind {
		case "write":
			unix.RawSyscall(unix.SYS_WRITE, uintptr(null), p, 64)
			return 1
		case "read":
			unix.RawSyscall(unix.SYS_READ, uintptr(zero), p, 64)
			return 1
		case "sendto+recvfrom":
			unix.RawSyscall6(unix.SYS_SENDTO, uintptr(sp[0]), p, 64, 0, 0, 0)
			unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(sp[1]), p, 64, 0, 0, 0)
			return 2
		case trapKind:
			trapTarget()
			return 1
		default:
			unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
			return 1
		}
	}
	out := map[string]float64{}
	for _, kind := range append(loopKinds, trapKind) {
		per := iters / batches
		if kind == trapKind {
			per = max(per/10, 100) // a trap costs microseconds
		}
		for i := 0; i < per/4; i++ { // warm caches and branch predictors
			one(kind)
		}
		// The fastest batch: other tenants of a small machine and interrupts
		// only ever add time, so the minimum over many short batches is the
		// syscall's own cost; every mode is measured the same way.
		var b []float64
		for j := 0; j < batches; j++ {
			calls := 0
			t0 := time.Now()
			for i := 0; i < per; i++ {
				calls += one(kind)
			}
			b = append(b, float64(time.Since(t0).Nanoseconds())/float64(calls))
		}
		out[kind] = Percentile(b, 0)
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// taxRun is one timing of the loop in one mode.
type taxRun struct {
	Mode  string             `json:"mode"` // untraced, empty, gymtrace
	Round int                `json:"round"`
	NsPer map[string]float64 `json:"ns_per_syscall"`
}

type taxOptions struct {
	Self, Gymtrace, Dir string
	Rounds, Iters       int
	CPU                 string // CPU the loop is pinned to
	Log                 *slog.Logger
}

// taxModes: gymtrace first, so round 1 learns its hooks before the floor
// is attached. The uprobe modes put an empty program on trapTarget, as an
// entry probe and as a return probe (which also traps at the entry).
var taxModes = []string{"gymtrace", "empty", "untraced"}

func taxModesHere() []string {
	if !trapProbes {
		return taxModes
	}
	return append(append([]string(nil), taxModes...), "uprobe", "uretprobe")
}

func runTax(ctx context.Context, o taxOptions) ([]taxRun, []string, error) {
	dir := workDir(o.Dir, "tax")
	// gymtrace needs a target; an idle process keeps it attached and quiet.
	idle, err := startChild("idle target", []string{"sleep", "3600"}, nil, filepath.Join(dir, "idle.log"), nil)
	if err != nil {
		return nil, nil, err
	}
	defer idle.stop(time.Second)

	hooks := append([]string(nil), gymtraceHooks...)
	var runs []taxRun
	modes := taxModesHere()
	for r := 0; r < o.Rounds; r++ {
		for _, i := range rotation(len(modes), r) {
			mode := modes[i]
			ns, err := taxOnce(ctx, o, dir, mode, r, idle.pid(), &hooks)
			if err != nil {
				return runs, hooks, fmt.Errorf("untargeted tax, %s, round %d: %w", mode, r+1, err)
			}
			o.Log.Info("tax run", "round", r+1, "mode", mode, "ns_per_syscall", ns)
			runs = append(runs, taxRun{Mode: mode, Round: r, NsPer: ns})
		}
	}
	return runs, hooks, nil
}

func taxOnce(ctx context.Context, o taxOptions, dir, mode string, round, target int, hooks *[]string) (map[string]float64, error) {
	switch mode {
	case "empty":
		f, err := attachEmptyFloor(*hooks)
		if err != nil {
			return nil, err
		}
		defer f.Close()
	case "uprobe", "uretprobe":
		f, err := attachTrapProbe(o.Self, mode == "uretprobe")
		if err != nil {
			return nil, err
		}
		defer f.Close()
	case "gymtrace":
		gt, err := startGymtrace(ctx, gymtraceOptions{
			Bin:     o.Gymtrace,
			Args:    []string{"--pid", fmt.Sprintf("%d=agent", target), "--exporter", "jsonl", "--output", "/dev/null"},
			LogPath: filepath.Join(dir, fmt.Sprintf("gymtrace-r%d.log", round)),
		})
		if err != nil {
			return nil, err
		}
		defer gt.stop(15 * time.Second)
		h, err := syscallHooks(gt.pid())
		if err != nil {
			return nil, err
		}
		if len(h) == 0 {
			return nil, fmt.Errorf("gymtrace holds no syscall tracepoint program (gt_exit_*/gt_enter_*): nothing to put the floor on")
		}
		*hooks = h
	}
	time.Sleep(200 * time.Millisecond) // let attach settle
	cmd := exec.CommandContext(ctx, "taskset", "-c", o.CPU, o.Self, "loop", strconv.Itoa(o.Iters))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the syscall loop failed: %v: %s", err, tail(errb.String(), 500))
	}
	ns := map[string]float64{}
	if err := json.Unmarshal(out.Bytes(), &ns); err != nil {
		return nil, fmt.Errorf("the syscall loop printed %q: %w", out.String(), err)
	}
	return ns, nil
}

// syscallHooks are the syscall tracepoints gymtrace's programs sit on, from
// their names (gt_exit_read -> sys_exit_read): the floor goes on the same.
func syscallHooks(pid int) ([]string, error) {
	progs, _, err := bpfObjects(pid)
	if err != nil {
		return nil, err
	}
	var hooks []string
	for id := range progs {
		meta, err := programMeta(id)
		if err != nil || meta.Type != "TracePoint" {
			continue
		}
		if h := hookOfProgram(meta.Name); h != "" {
			hooks = append(hooks, h)
		}
	}
	sort.Strings(hooks)
	return hooks, nil
}
