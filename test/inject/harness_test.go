//go:build linux

// Package inject tests traceparent injection (bpf/inject.h, internal/inject)
// on live sockets: byte-exactness over fuzzed request shapes, two gymtraces
// on two network namespaces joined by a veth pair, and the throughput cost.
// Every test needs root and skips with the reason otherwise.
package inject

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/inject/testbpf"
	"github.com/gymtrace/gymtrace/internal/preflight"
)

// childEnv re-executes this test binary as a traced program (see TestMain).
const childEnv = "GYMTRACE_INJECT_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "client":
		os.Exit(runClient())
	case "bench":
		os.Exit(runBenchClient())
	case "preconnected":
		os.Exit(runPreconnected())
	case "connectlater":
		os.Exit(runConnectLater())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childEnv, os.Getenv(childEnv))
		os.Exit(2)
	}
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and attaches to the cgroup v2 root")
	}
	if _, err := preflight.CgroupV2Path(); err != nil {
		t.Skipf("needs a cgroup v2 mount: %v", err)
	}
}

// kernel is the test object loaded and attached: the syscall parser plus
// injection, one target set, and the request records it emits.
type kernel struct {
	o     *testbpf.Objects
	inj   *inject.Injector
	links []link.Link
	rd    *ringbuf.Reader

	mu      sync.Mutex
	events  []testbpf.Event
	discard atomic.Bool // benchmarks: read records, keep none
	done    chan struct{}
}

func loadKernel(t testing.TB, withInject bool) *kernel {
	t.Helper()
	o, err := testbpf.Load()
	if err != nil {
		t.Fatalf("loading the test object: %v", err)
	}
	k := &kernel{o: o, done: make(chan struct{})}
	t.Cleanup(k.close)
	cfg := testbpf.Config{
		Mask:           testbpf.GroupServer | testbpf.GroupHTTPClient,
		ClientPossible: testbpf.GroupHTTPClient,
		Generation:     1,
	}
	for i := range cfg.ServerPossible {
		cfg.ServerPossible[i] = testbpf.GroupServer
	}
	if err := o.GtConfig.Put(uint32(0), &cfg); err != nil {
		t.Fatalf("writing the gate: %v", err)
	}
	for name, p := range map[string]*ebpf.Program{
		"sys_exit_read": o.GtExitRead, "sys_exit_recvfrom": o.GtExitRecvfrom, "sys_exit_readv": o.GtExitReadv,
		"sys_exit_recvmsg": o.GtExitRecvmsg, "sys_exit_write": o.GtExitWrite, "sys_exit_sendto": o.GtExitSendto,
		"sys_exit_writev": o.GtExitWritev, "sys_exit_sendmsg": o.GtExitSendmsg, "sys_enter_close": o.GtEnterClose,
	} {
		l, err := link.Tracepoint("syscalls", name, p, nil)
		if err != nil {
			t.Fatalf("attaching %s: %v", name, err)
		}
		k.links = append(k.links, l)
	}
	if withInject {
		cg, _ := preflight.CgroupV2Path()
		k.inj, err = inject.Attach(programs(o), inject.Options{CgroupPath: cg, SampleRatio: 1})
		if err != nil {
			t.Fatalf("attaching injection: %v", err)
		}
	}
	k.rd, err = ringbuf.NewReader(o.GtEvents)
	if err != nil {
		t.Fatalf("opening the ring buffer: %v", err)
	}
	go k.read()
	return k
}

func programs(o *testbpf.Objects) inject.Programs {
	return inject.Programs{
		SockOps: o.GtInjectSockops, SkMsg: o.GtInjectMsg,
		EnterWrite: o.GtInjectEnterWrite, EnterSendto: o.GtInjectEnterSendto,
		EnterWritev: o.GtInjectEnterWritev, EnterSendmsg: o.GtInjectEnterSendmsg,
		Config: o.GtInjectConfig, TraceCtxs: o.GtTraceCtxs, Socks: o.GtInjectSocks, Stats: o.GtInjectStats,
		Procs: o.GtInjectProcs,
	}
}

func (k *kernel) read() {
	defer close(k.done)
	var rec ringbuf.Record
	for {
		// Records are submitted without waking the reader (bpf/common/util.h):
		// look every 10 ms.
		k.rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
		if err := k.rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			return
		}
		var ev testbpf.Event
		// Responses are the record's head alone (GT_HTTP_EVENT_HEAD: the fields
		// before Reward), or the head and the reward.
		if k.discard.Load() || len(rec.RawSample) < int(unsafe.Offsetof(ev.Reward)) {
			continue
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&ev)), unsafe.Sizeof(ev)), rec.RawSample)
		k.mu.Lock()
		k.events = append(k.events, ev)
		k.mu.Unlock()
	}
}

func (k *kernel) addTarget(t testing.TB, pid int) {
	t.Helper()
	word := uint32(pid >> 6)
	var bits uint64
	if err := k.o.GtTargetBits.Lookup(word, &bits); err != nil {
		t.Fatalf("reading target bits: %v", err)
	}
	bits |= 1 << (pid & 63)
	if err := k.o.GtTargetBits.Put(word, bits); err != nil {
		t.Fatalf("writing target bits: %v", err)
	}
	if err := k.o.GtTargets.Put(uint32(pid), testbpf.Target{}); err != nil {
		t.Fatalf("adding target: %v", err)
	}
}

// requests returns the request records of pid seen so far.
func (k *kernel) requests(pid int) []testbpf.Event {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []testbpf.Event
	for _, e := range k.events {
		if e.Kind == testbpf.EvRequest && int(e.Pid) == pid {
			out = append(out, e)
		}
	}
	return out
}

func (k *kernel) stats(t testing.TB) []uint64 {
	t.Helper()
	if k.inj == nil {
		return make([]uint64, 16)
	}
	st, err := k.inj.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (k *kernel) close() {
	if k.inj != nil {
		k.inj.Close()
	}
	for _, l := range k.links {
		l.Close()
	}
	if k.rd != nil {
		k.rd.Close()
		<-k.done
	}
	k.o.Close()
}

// child is this binary re-executed as a traced program. It waits for a line
// on stdin before making any connection, so the test can target it first
// (the socket program decides at connect()).
type child struct {
	cmd   *exec.Cmd
	stdin *os.File
	out   *bufio.Reader
	wait  chan error
}

func startChild(t testing.TB, mode string, env ...string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s child: %v", mode, err)
	}
	inR.Close()
	outW.Close()
	c := &child{cmd: cmd, stdin: inW, out: bufio.NewReader(outR), wait: make(chan error, 1)}
	go func() { c.wait <- cmd.Wait() }()
	t.Cleanup(func() {
		c.stdin.Close()
		select {
		case <-c.wait:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-c.wait
		}
	})
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// go lets the child start; it then prints one line when done.
func (c *child) run(ctx context.Context) (string, error) {
	if _, err := c.stdin.WriteString("go\n"); err != nil {
		return "", fmt.Errorf("signalling the child: %w", err)
	}
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := c.out.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return r.s, fmt.Errorf("reading the child's report: %w (exit: %v)", r.err, <-c.wait)
		}
		return r.s, nil
	case <-ctx.Done():
		return "", errors.New("the child did not finish in time")
	}
}
