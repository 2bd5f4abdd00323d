//go:build linux

package main

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/probesite"
)

// gymtraceHooks are the syscall tracepoints gymtrace attaches (internal/loader):
// the exits of the data syscalls and the entry of close. The tax phase reads
// the running gymtrace's own programs and puts the floor on those; this list
// completes names the kernel cut to 15 bytes.
var gymtraceHooks = []string{
	"sys_exit_read", "sys_exit_recvfrom", "sys_exit_readv", "sys_exit_recvmsg",
	"sys_exit_write", "sys_exit_sendto", "sys_exit_writev", "sys_exit_sendmsg",
	"sys_enter_close",
}

// injectHooks are the syscall entries traceparent injection's decision
// programs sit on (bpf/inject.h, on by default). The hit counter counts them
// too, so those programs' cost on the traced servers is in the eBPF time
// per request; hits per request stay the syscalls of gymtraceHooks (an
// entry and an exit of the same write are one syscall).
var injectHooks = []string{"sys_enter_write", "sys_enter_sendto", "sys_enter_writev", "sys_enter_sendmsg"}

// hookOfProgram maps a gymtrace program name to its syscall tracepoint:
// gt_exit_read -> sys_exit_read, gt_enter_close -> sys_enter_close; "" for
// programs elsewhere (sched, uprobes). Kernel names are cut at 15 bytes, so a
// cut name is completed from the known hooks.
func hookOfProgram(name string) string {
	for _, h := range gymtraceHooks {
		full := "gt_" + strings.TrimPrefix(h, "sys_")
		if name == full || (len(name) == 15 && strings.HasPrefix(full, name)) {
			return h
		}
	}
	// Injection's decision programs sit on syscall entries too (bpf/inject.h).
	if rest, ok := strings.CutPrefix(name, "gt_inject_enter_"); ok && rest != "" {
		return "sys_enter_" + rest
	}
	for _, p := range []string{"gt_exit_", "gt_enter_"} {
		if rest, ok := strings.CutPrefix(name, p); ok && rest != "" && len(name) <= 15 {
			return "sys_" + strings.TrimPrefix(p, "gt_") + rest
		}
	}
	return ""
}

// progMeta is what the harness shows of a program besides its counters.
type progMeta struct {
	Name string
	Type string
}

// programMeta names a program by ID. cilium/ebpf takes the full function
// name from BTF when the kernel's 16-byte name was cut.
func programMeta(id uint32) (progMeta, error) {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return progMeta{}, fmt.Errorf("opening BPF program %d: %w", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return progMeta{}, fmt.Errorf("reading BPF program %d info: %w", id, err)
	}
	return progMeta{Name: info.Name, Type: info.Type.String()}, nil
}

func mapName(id uint32) string {
	m, err := ebpf.NewMapFromID(ebpf.MapID(id))
	if err != nil {
		return ""
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

// ringbufProducerPos reads the BPF ring buffer's producer position: the
// total bytes ever reserved in it (8-byte record headers included). The
// kernel lets any holder of the map's fd map that page read-only, so the
// bytes copied out of the kernel are measured exactly, with no product
// counter and no effect on the tracer.
func ringbufProducerPos(mapID uint32) (uint64, error) {
	m, err := ebpf.NewMapFromID(ebpf.MapID(mapID))
	if err != nil {
		return 0, fmt.Errorf("opening ring buffer map %d: %w", mapID, err)
	}
	defer m.Close()
	page := os.Getpagesize()
	mem, err := unix.Mmap(m.FD(), int64(page), page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mapping the producer page of ring buffer %d: %w", mapID, err)
	}
	defer unix.Munmap(mem)
	return binary.NativeEndian.Uint64(mem[:8]), nil
}

// ringbufRecordBytes is the ring-buffer footprint of one request record:
// the 8-byte header plus the whole http_event, rounded up to 8 bytes
// (responses carry only its head, loader.HTTPEventHeadSize).
func ringbufRecordBytes() uint64 {
	return uint64((loader.HTTPEventSize + 8 + 7) &^ 7)
}

// gateFlags reads gt_config.flags from a running gymtrace's map, so the
// report says which mode the kernel actually ran in.
func gateFlags(mapID uint32) (uint32, error) {
	m, err := ebpf.NewMapFromID(ebpf.MapID(mapID))
	if err != nil {
		return 0, fmt.Errorf("opening gt_config map %d: %w", mapID, err)
	}
	defer m.Close()
	var cfg loader.Config
	if err := m.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("reading gt_config: %w", err)
	}
	return cfg.Flags, nil
}

// enableStats turns on kernel.bpf_stats_enabled for as long as the returned
// closer is open (the kernel counts holders, so it never turns off stats
// another tool asked for).
func enableStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling bpf_stats (needs root and Linux >= 5.8): %w", err)
	}
	return c, nil
}

// bpfStatsSysctl is the current kernel.bpf_stats_enabled value ("" if unknown).
func bpfStatsSysctl() string {
	b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// emptyFloor is a program that returns 0 at once, attached to every gymtrace
// hook: what any tracepoint program costs on those hooks before it does a
// thing. gymtrace's untargeted tax is measured above it.
type emptyFloor struct {
	prog  *ebpf.Program
	links []link.Link
}

// emptyProgram returns 0 at once: what a hook costs before a program does a
// thing.
func emptyProgram(name string, typ ebpf.ProgramType) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         name,
		Type:         typ,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

func attachEmptyFloor(hooks []string) (*emptyFloor, error) {
	prog, err := emptyProgram("gtbench_empty", ebpf.TracePoint)
	if err != nil {
		return nil, fmt.Errorf("loading the empty floor program: %w", err)
	}
	f := &emptyFloor{prog: prog}
	for _, h := range hooks {
		l, err := link.Tracepoint("syscalls", h, prog, nil)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("attaching the empty program to syscalls/%s (is tracefs mounted?): %w", h, err)
		}
		f.links = append(f.links, l)
	}
	return f, nil
}

func (f *emptyFloor) Close() error {
	var errs []error
	for _, l := range f.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, f.prog.Close())
	return errors.Join(errs...)
}

// attachTrapProbe puts a program that returns 0 at once on trapTarget of the
// bench binary at self, as an entry probe or a return probe: the loop's calls
// of it then cost the bare call plus the kernel's uprobe round trip. Every
// process running self would trap; only the loop child calls trapTarget.
func attachTrapProbe(self string, ret bool) (*emptyFloor, error) {
	sym, err := trapSymbol(self)
	if err != nil {
		return nil, err
	}
	prog, err := emptyProgram("gtbench_trap", ebpf.Kprobe) // uprobes are kprobe programs
	if err != nil {
		return nil, fmt.Errorf("loading the empty uprobe program: %w", err)
	}
	f := &emptyFloor{prog: prog}
	ex, err := link.OpenExecutable(self)
	if err != nil {
		f.Close()
		return nil, err
	}
	attach := ex.Uprobe
	if ret {
		attach = ex.Uretprobe
	}
	l, err := attach(sym, prog, nil)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attaching the empty program to %s in %s: %w", sym, self, err)
	}
	f.links = append(f.links, l)
	return f, nil
}

// trapSymbol names trapTarget's assembly body in the bench binary (the
// linker may add an ABI wrapper under the plain name) and checks that the
// kernel emulates its first instruction: a single-stepped probe would cost
// several times a real site's.
func trapSymbol(self string) (string, error) {
	f, err := elf.Open(self)
	if err != nil {
		return "", err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return "", fmt.Errorf("reading the symbols of %s: %w", self, err)
	}
	for _, name := range []string{"main.trapTarget.abi0", "main.trapTarget"} {
		for _, s := range syms {
			if s.Name != name {
				continue
			}
			if _, cheap, err := probesite.Entry(f, s.Value); err != nil || !cheap {
				return "", fmt.Errorf("%s in %s does not start with an instruction the kernel emulates (err %v)", name, self, err)
			}
			return name, nil
		}
	}
	return "", fmt.Errorf("no trapTarget symbol in %s (built stripped?)", self)
}
