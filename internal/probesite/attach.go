//go:build linux

package probesite

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/gymtrace/gymtrace/internal/kversion"
	"golang.org/x/sys/unix"
)

// Detaching a uprobe attached through perf_event_open costs the kernel two
// RCU grace periods (the uprobe's and the trace event's) under the global
// event_mutex, so a process's probes come off one after another however
// many goroutines close them: about 70 ms each on an idle 2-core guest, a
// second each under load, and a shutdown with a hundred of them outlived
// its callers' patience (issue 37). A uprobe_multi link (Linux 6.6) holds
// any number of uprobes and detaches them all with one grace period, taken
// outside that mutex, so links closed together share it. Measured here: 40
// perf uprobes 2.5 s to close, the same 40 as four uprobe_multi links
// 15-100 ms.

// Spec is one uprobe to place: in the file, at Symbol (resolved from its
// symbol table) or at Address (the file offset uprobes take), plus Offset;
// with Cookie for bpf_get_attach_cookie.
type Spec struct {
	Symbol  string
	Address uint64
	Offset  uint64
	Cookie  uint64
}

// multiOff: GYMTRACE_UPROBE_MULTI=0 attaches every uprobe by itself, as on
// kernels without uprobe_multi (a fallback should the multi links
// misbehave somewhere, and cost comparisons).
var multiOff = os.Getenv("GYMTRACE_UPROBE_MULTI") == "0"

var multiOnce = sync.OnceValue(func() bool {
	if multiOff || features.HaveBPFLinkUprobeMulti() != nil {
		return false
	}
	// Before Linux 6.11 (46ba0e49b642) a uprobe_multi link's pid filter let
	// only the process's main thread through; a perf uprobe's takes every
	// thread, which the TLS probes need (OpenSSL in a worker thread).
	return kversion.AtLeast(6, 11)
})

// MultiWanted reports whether uprobes go on as uprobe_multi links here: the
// kernel has them, with a pid filter that takes the whole process, and
// GYMTRACE_UPROBE_MULTI=0 does not say otherwise.
func MultiWanted() bool { return multiOnce() }

// PrepareMulti makes the uprobe programs of spec (sections uprobe* and
// uretprobe*) uprobe_multi programs when MultiWanted. Call it before the
// spec is loaded: the kernel takes a program's attach type at load, and a
// uprobe_multi program cannot be attached by perf_event_open.
func PrepareMulti(spec *ebpf.CollectionSpec) {
	if !MultiWanted() {
		return
	}
	for _, p := range spec.Programs {
		if p.Type == ebpf.Kprobe && (strings.HasPrefix(p.SectionName, "uprobe") || strings.HasPrefix(p.SectionName, "uretprobe")) {
			p.AttachType = ebpf.AttachTraceUprobeMulti
		}
	}
}

// classic remembers the programs a uprobe_multi link refused: loaded
// without PrepareMulti, they are attached one uprobe at a time.
var classic sync.Map // *ebpf.Program -> struct{}

// Attach places prog at every spec in ex, entry probes or with ret return
// probes, filtered to process pid (0: every process mapping the file).
// Where the kernel and prog allow, all of them are one uprobe_multi link
// (one detach, see above); otherwise each is a link of its own. On error
// nothing stays attached.
func Attach(ex *link.Executable, prog *ebpf.Program, pid int, ret bool, specs []Spec) ([]link.Link, error) {
	if prog == nil {
		return nil, errors.New("attaching uprobes: no program")
	}
	if len(specs) == 0 {
		return nil, nil
	}
	var multiErr error
	if _, refused := classic.Load(prog); MultiWanted() && !refused {
		l, err := attachMulti(ex, prog, pid, ret, specs)
		if err == nil {
			return []link.Link{l}, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, err // the process is gone, a symbol is missing, ...: the same one by one
		}
		multiErr = err
	}
	ls, err := attachEach(ex, prog, pid, ret, specs)
	if err != nil {
		if multiErr != nil {
			return nil, fmt.Errorf("%w (as one uprobe_multi link: %v)", err, multiErr)
		}
		return nil, err
	}
	if multiErr != nil {
		classic.Store(prog, struct{}{}) // loaded without PrepareMulti: do not ask again
	}
	return ls, nil
}

func attachMulti(ex *link.Executable, prog *ebpf.Program, pid int, ret bool, specs []Spec) (link.Link, error) {
	n := len(specs)
	opts := &link.UprobeMultiOptions{PID: uint32(pid), Addresses: make([]uint64, n), Offsets: make([]uint64, n),
		Cookies: make([]uint64, n)}
	syms := make([]string, n)
	for i, s := range specs {
		syms[i], opts.Addresses[i], opts.Offsets[i], opts.Cookies[i] = s.Symbol, s.Address, s.Offset, s.Cookie
	}
	if ret {
		return ex.UretprobeMulti(syms, prog, opts)
	}
	return ex.UprobeMulti(syms, prog, opts)
}

func attachEach(ex *link.Executable, prog *ebpf.Program, pid int, ret bool, specs []Spec) ([]link.Link, error) {
	var ls []link.Link
	for _, s := range specs {
		o := &link.UprobeOptions{PID: pid, Address: s.Address, Offset: s.Offset, Cookie: s.Cookie}
		var l link.Link
		var err error
		if ret {
			l, err = ex.Uretprobe(s.Symbol, prog, o)
		} else {
			l, err = ex.Uprobe(s.Symbol, prog, o)
		}
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// CloseAll closes every c at once (at most closeAtOnce at a time), so that
// the kernel's waits for their grace periods overlap instead of adding up.
// It returns when all are closed.
func CloseAll[C io.Closer](cs []C) error {
	errs := make([]error, len(cs))
	sem := make(chan struct{}, closeAtOnce)
	var wg sync.WaitGroup
	for i, c := range cs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = c.Close()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeAtOnce bounds CloseAll's goroutines: each close waits in the kernel
// on a thread of its own.
const closeAtOnce = 32
