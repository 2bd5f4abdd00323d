//go:build linux

package main

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// hitCounter counts, per hook, the syscalls the traced processes make on
// gymtrace's hooks. bpf_stats counts every run of a program, and a syscall
// tracepoint program runs for every process on the host: on a shared machine
// most hits are other processes'. With this count the harness splits
// gymtrace's eBPF time into what the traced requests cost and what the rest
// of the host paid at the gate. Its own cost (one hash lookup per syscall on
// those hooks) is the same in every configuration, untraced included, so it
// cancels out of the ratios.
//
// One counter serves every stack of a run: each watched pid maps to its
// stack's slot, and each slot has its own counts, so the host pays for one
// program per hook however many stacks there are.
type hitCounter struct {
	hooks   []string
	slots   int
	watched *ebpf.Map
	counts  *ebpf.Map
	progs   []*ebpf.Program
	links   []link.Link
}

func newHitCounter(hooks []string, slots int) (*hitCounter, error) {
	c := &hitCounter{hooks: hooks, slots: slots}
	var err error
	c.watched, err = ebpf.NewMap(&ebpf.MapSpec{Name: "gtb_watched", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 256})
	if err != nil {
		return nil, fmt.Errorf("creating the hit counter's pid map: %w", err)
	}
	c.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "gtb_counts", Type: ebpf.Array, KeySize: 4, ValueSize: 8,
		MaxEntries: uint32(len(hooks) * slots)})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("creating the hit counter's array: %w", err)
	}
	for i, h := range hooks {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name:         "gtbench_count",
			Type:         ebpf.TracePoint,
			License:      "GPL",
			Instructions: counterInsns(c.watched, c.counts, int32(i), int32(len(hooks))),
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("loading the hit counter for %s: %w", h, err)
		}
		c.progs = append(c.progs, prog)
		l, err := link.Tracepoint("syscalls", h, prog, nil)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("attaching the hit counter to syscalls/%s: %w", h, err)
		}
		c.links = append(c.links, l)
	}
	return c, nil
}

// Watch counts the syscalls of pids in slot.
func (c *hitCounter) Watch(slot int, pids []int) error {
	if slot < 0 || slot >= c.slots {
		return fmt.Errorf("hit counter slot %d out of %d", slot, c.slots)
	}
	for _, p := range pids {
		if err := c.watched.Put(uint32(p), uint32(slot)); err != nil {
			return fmt.Errorf("watching pid %d: %w", p, err)
		}
	}
	return nil
}

// counterInsns: if watched[tgid] = slot exists, counts[slot*nhooks+idx] += 1
// (atomically).
func counterInsns(watched, counts *ebpf.Map, idx, nhooks int32) asm.Instructions {
	return asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.RFP, -4, asm.R0, asm.Word),
		asm.LoadMapPtr(asm.R1, watched.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.Mul.Imm(asm.R1, nhooks),
		asm.Add.Imm(asm.R1, idx),
		asm.StoreMem(asm.RFP, -8, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, counts.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

// Read returns the hits so far per hook of the pids in slot.
func (c *hitCounter) Read(slot int) (map[string]uint64, error) {
	out := map[string]uint64{}
	for i, h := range c.hooks {
		var v uint64
		if err := c.counts.Lookup(uint32(slot*len(c.hooks)+i), &v); err != nil {
			return nil, fmt.Errorf("reading the hit counter: %w", err)
		}
		out[h] = v
	}
	return out, nil
}

func (c *hitCounter) Close() error {
	var errs []error
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	for _, p := range c.progs {
		errs = append(errs, p.Close())
	}
	for _, m := range []*ebpf.Map{c.watched, c.counts} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
