//go:build linux

// Command pactive reports which tasks are switched out while holding their
// CPU's bpf_prog_active, the per-CPU count under which the kernel skips
// every kprobe and tracepoint program (a program's recursion_misses;
// gymtrace_kernel_events_total{reason="program_skipped"}). On a kernel that
// preempts, a holder preempted inside its section hides the traced
// servers' syscalls from gymtrace until it runs again. A diagnostic for
// scripts/kernel-matrix's guests (KMATRIX_PACTIVE=1) and for anyone asking
// why their kernel skips gymtrace's programs; it changes nothing.
//
//	pactive [-for DURATION]     runs until SIGINT/SIGTERM or DURATION, then prints
//
// Output: switch-outs under bpf_prog_active, and preemptions inside a BPF
// program, per task (pid, name, how many while runnable, i.e. preempted),
// and the most common kernel stacks, symbolised with /proc/kallsyms.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

func main() {
	dur := flag.Duration("for", 0, "stop after this long (0: at SIGINT or SIGTERM)")
	flag.Parse()
	if err := run(*dur); err != nil {
		fmt.Fprintln(os.Stderr, "pactive:", err)
		os.Exit(1)
	}
}

type holder struct {
	pid, tgid    uint32
	comm         string
	n, preempted int
	stacks       map[string]int
}

func run(dur time.Duration) error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	syms := kallsyms()
	active, ok1 := syms.addr("bpf_prog_active")
	offs, ok2 := syms.addr("__per_cpu_offset")
	if !ok1 || !ok2 {
		return errors.New("/proc/kallsyms has no bpf_prog_active or __per_cpu_offset (run as root, with kallsyms readable)")
	}
	spec, err := loadPactive()
	if err != nil {
		return err
	}
	if err := spec.Variables["pa_prog_active"].Set(active); err != nil {
		return err
	}
	if err := spec.Variables["pa_per_cpu_offset"].Set(offs); err != nil {
		return err
	}
	cur, ok := syms.addr("current_task")
	if !ok {
		cur, _ = syms.addr("pcpu_hot")
	}
	if err := spec.Variables["pa_current_task"].Set(cur); err != nil {
		return err
	}
	var objs pactiveObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return fmt.Errorf("loading (needs root): %w", err)
	}
	defer objs.Close()
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_switch", Program: objs.PaSwitch})
	if err != nil {
		return fmt.Errorf("attaching raw tracepoint sched_switch: %w", err)
	}
	defer l.Close()
	rd, err := ringbuf.NewReader(objs.PaOut)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if dur > 0 {
			select {
			case <-sig:
			case <-time.After(dur):
			}
		} else {
			<-sig
		}
		rd.Close()
	}()
	fmt.Fprintln(os.Stderr, "pactive: watching sched_switch")
	holders := map[uint32]*holder{}
	total, preempts, inProg := 0, 0, 0
	for {
		rec, err := rd.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			break
		}
		if err != nil {
			return err
		}
		var r pactivePaRec
		if len(rec.RawSample) < int(unsafe.Sizeof(r)) {
			continue
		}
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &r); err != nil {
			continue
		}
		var key []string
		for i := 0; i < int(r.StackLen/8) && i < len(r.Stack); i++ {
			key = append(key, strconv.FormatUint(r.Stack[i], 16))
		}
		sk := strings.Join(key, ",")
		if r.Active == 0 {
			// A preemption outside bpf_prog_active: kept only when it
			// stopped inside a BPF program (per-program recursion counts).
			if !inBPF(syms, sk) {
				preempts++
				continue
			}
			inProg++
		}
		total++
		h := holders[r.Pid]
		if h == nil {
			h = &holder{pid: r.Pid, tgid: r.Tgid, comm: cstr(r.Comm[:]), stacks: map[string]int{}}
			holders[r.Pid] = h
		}
		h.n++
		if r.Preempt != 0 {
			h.preempted++
		}
		h.stacks[sk]++
	}
	var same, differ uint64
	_ = objs.PaCheck.Lookup(uint32(0), &same)
	_ = objs.PaCheck.Lookup(uint32(1), &differ)
	fmt.Printf("address check (the current task read through the per-CPU area against bpf_get_current_task): %d equal, %d not; preemptions outside any BPF program %d, inside one %d\n", same, differ, preempts, inProg)
	report(syms, holders, total)
	return nil
}

func report(syms symtab, holders map[uint32]*holder, total int) {
	fmt.Printf("switch-outs recorded (bpf_prog_active held, or preempted inside a BPF program): %d\n", total)
	list := make([]*holder, 0, len(holders))
	for _, h := range holders {
		list = append(list, h)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n })
	for _, h := range list {
		fmt.Printf("%6d  pid %d (tgid %d) %s: %d preempted\n", h.n, h.pid, h.tgid, h.comm, h.preempted)
		type st struct {
			k string
			n int
		}
		var ss []st
		for k, n := range h.stacks {
			ss = append(ss, st{k, n})
		}
		sort.Slice(ss, func(i, j int) bool { return ss[i].n > ss[j].n })
		for i, s := range ss {
			if i == 3 {
				break
			}
			fmt.Printf("        %d x:", s.n)
			below := false
			for _, a := range strings.Split(s.k, ",") {
				if a == "" {
					continue
				}
				v, _ := strconv.ParseUint(a, 16, 64)
				n := syms.name(v)
				if !below {
					below = strings.HasPrefix(n, "__schedule+")
					continue
				}
				fmt.Printf(" %s", n)
			}
			fmt.Println()
		}
	}
}

// inBPF: the preempted task's stack passes through a BPF program (JITed programs are named
// bpf_prog_TAG_NAME in kallsyms) or the kernel's code that runs one.
// Frames up to __schedule are this program's own (the raw tracepoint fires
// inside the switch).
func inBPF(syms symtab, stack string) bool {
	below := false
	for _, a := range strings.Split(stack, ",") {
		v, err := strconv.ParseUint(a, 16, 64)
		if err != nil {
			continue
		}
		n := syms.name(v)
		if !below {
			below = strings.HasPrefix(n, "__schedule+")
			continue
		}
		if strings.HasPrefix(n, "bpf_prog_") || strings.HasPrefix(n, "trace_call_bpf") || strings.HasPrefix(n, "bpf_preempt_enable") || strings.HasPrefix(n, "bpf_trace_run") || strings.HasPrefix(n, "uprobe_prog_run") {
			return true
		}
	}
	return false
}

func cstr(b []int8) string {
	var out []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

type symtab struct {
	addrs []uint64
	names []string
	vars  map[string]uint64
}

func (t symtab) addr(name string) (uint64, bool) {
	a, ok := t.vars[name]
	return a, ok && (name != "__per_cpu_offset" || a != 0)
}

// kallsyms reads every symbol: text ones name stack addresses, and the
// per-CPU variable and offset table the program reads.
func kallsyms() symtab {
	var t symtab
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return t
	}
	defer f.Close()
	type s struct {
		a uint64
		n string
	}
	var all []s
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			continue
		}
		a, err := strconv.ParseUint(fs[0], 16, 64)
		if err != nil {
			continue
		}
		if fs[2] == "bpf_prog_active" || fs[2] == "__per_cpu_offset" || fs[2] == "current_task" || fs[2] == "pcpu_hot" {
			if t.vars == nil {
				t.vars = map[string]uint64{}
			}
			t.vars[fs[2]] = a
		}
		if (fs[1] != "t" && fs[1] != "T") || a == 0 {
			continue
		}
		all = append(all, s{a, fs[2]})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].a < all[j].a })
	for _, x := range all {
		t.addrs = append(t.addrs, x.a)
		t.names = append(t.names, x.n)
	}
	return t
}

func (t symtab) name(a uint64) string {
	i := sort.Search(len(t.addrs), func(i int) bool { return t.addrs[i] > a }) - 1
	if i < 0 {
		return fmt.Sprintf("%#x", a)
	}
	return fmt.Sprintf("%s+%#x", t.names[i], a-t.addrs[i])
}
