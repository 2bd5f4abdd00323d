//go:build linux

package tls

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	"github.com/gymtrace/gymtrace/internal/tls/testbpf"
)

// TestKernelUnderstudy: the syscall programs' understudies
// (bpf/common/understudy.h), loaded and attached as gymtrace does where the
// kernel runs syscall programs preemptible and skips a program while one of
// its runs is stopped (sid's 7.2). This kernel does not skip them, so the
// test takes the programs off instead, leaving their understudies on:
//
//   - /a, programs and understudies on: each record once (an understudy
//     that also ran its program would parse the bytes twice), no event
//     stood in for, no mark left behind;
//   - /b, the read and write programs off (as if the kernel skipped every
//     run of them): the understudies make those runs, the records are the
//     same as /a's, each once, with the next indexes, and program_stood_in
//     counts at least the four syscalls.
//
// The understudies go on after the programs and before this process is a
// target, as gymtrace attaches them: a target's event seen by a program
// with no understudy yet would leave a mark behind.
func TestKernelUnderstudy(t *testing.T) {
	requireRoot(t)
	if kspec, err := btf.LoadKernelSpec(); err == nil {
		if _, err := kspec.AnyTypeByName("bpf_preempt_disable"); err != nil {
			t.Skip("this kernel has no bpf_preempt_disable (Linux 6.10+): syscall programs cannot hold preemption off, so gymtrace attaches no understudies here")
		}
	}
	if o, err := testbpf.LoadPinned(); err != nil && strings.Contains(err.Error(), "preempt") {
		msg, _, _ := strings.Cut(err.Error(), "\n")
		t.Skipf("this kernel's verifier does not let syscall programs hold preemption off over their calls, so gymtrace attaches no understudies here: %s", msg)
	} else if err == nil {
		o.Close()
	}
	k := loadKernelWith(t, testbpf.LoadPinned)
	var under []link.Link
	t.Cleanup(func() {
		for _, l := range under {
			l.Close()
		}
	})
	for _, sp := range syscallPrograms(k.objs) {
		if err := k.objs.GtSysTails.Put(sp.slot, sp.prog); err != nil {
			t.Fatal(err)
		}
		// After loadKernelWith attached the program.
		l, err := link.Tracepoint("syscalls", sp.name, sp.under, nil)
		if err != nil {
			t.Fatalf("attaching the understudy of %s: %v", sp.name, err)
		}
		under = append(under, l)
	}
	k.gate(t, groups.Server.Mask()|groups.HTTPClient.Mask(), 1)
	k.target(t, os.Getpid())
	cli, srv := loopbackPair(t)
	exchange := exchanger(t, cli, srv)
	// check wants exactly a request and a response on each side, with
	// index seq, and the understudies' count up by at least least (none if 0).
	check := func(path string, seq uint64, stoodBefore, least uint64) uint64 {
		t.Helper()
		type key struct {
			side, kind uint8
		}
		got := map[key][]string{}
		for _, e := range k.take(os.Getpid()) {
			if e.ev.Kind != testbpf.EvRequest && e.ev.Kind != testbpf.EvResponse {
				continue
			}
			p := ""
			if e.ev.Kind == testbpf.EvRequest {
				p = string(e.ev.Path[:min(int(e.ev.PathLen), len(e.ev.Path))])
			}
			if e.ev.Seq != seq || (e.ev.Kind == testbpf.EvRequest && p != path) {
				t.Errorf("%s: record side %d kind %d path %q index %d: want path %s, index %d", path, e.ev.Side, e.ev.Kind, p, e.ev.Seq, path, seq)
			}
			got[key{e.ev.Side, e.ev.Kind}] = append(got[key{e.ev.Side, e.ev.Kind}], p)
		}
		for _, side := range []uint8{uint8(loader.SideServer), uint8(loader.SideClient)} {
			for _, kind := range []uint8{testbpf.EvRequest, testbpf.EvResponse} {
				if n := len(got[key{side, kind}]); n != 1 {
					t.Errorf("%s: %d records of side %d kind %d, want 1 (records: %v)", path, n, side, kind, got)
				}
			}
		}
		stood := k.stat(t, testbpf.StatStoodIn)
		if stood-stoodBefore < least || (least == 0 && stood != stoodBefore) {
			t.Errorf("%s: program_stood_in went from %d to %d: want %s", path, stoodBefore, stood,
				map[bool]string{true: "no change", false: "at least 4 more"}[least == 0])
		}
		k.noMarksLeft(t, path)
		return stood
	}

	exchange("/a")
	stood := check("/a", 0, 0, 0)

	for _, name := range []string{"sys_exit_read", "sys_exit_write"} {
		if err := k.links[name].Close(); err != nil {
			t.Fatal(err)
		}
	}
	exchange("/b")
	check("/b", 1, stood, 4)
}

// noMarksLeft waits for gt_sys_ran to empty: a mark lives from a program's
// run to its understudy's, within one syscall of a thread of this process,
// so one still there after 10 s was left behind.
func (k *kernel) noMarksLeft(t *testing.T, when string) {
	t.Helper()
	var n int
	for range 100 {
		n = 0
		var key, val uint32
		it := k.objs.GtSysRan.Iterate()
		for it.Next(&key, &val) {
			n++
		}
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s: %d marks left in gt_sys_ran: a program's run its understudy did not see", when, n)
}

func loopbackPair(t *testing.T) (cli, srv net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cli, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	srv, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return cli, srv
}
