//go:build linux

package loader

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// MapOps runs gymtrace's map operations at run time (lookups, updates and
// deletes through bpf(2)) on one OS thread of their own.
//
// Why: a map syscall holds its CPU's bpf_prog_active for the length of the
// operation with only migration disabled (bpf_disable_instrumentation), and
// the kernel skips every tracepoint program that would run on that CPU while
// it is held. On a kernel that preempts (PREEMPT, PREEMPT_LAZY, or
// PREEMPT_DYNAMIC in full or lazy mode), a thread preempted inside one hides
// the traced servers' syscalls until it runs again: the programs' recursion
// misses (program_skipped), and on sid's 7.2 with one CPU up to a few dozen
// syscalls for one preempted operation. The thread runs SCHED_FIFO at the
// lowest real-time priority there, so no ordinary task preempts it inside an
// operation; on a kernel that does not preempt in kernel mode it stays an
// ordinary thread (an operation finishes before anything else runs on its
// CPU). SCHED_RESET_ON_FORK keeps the policy off threads it starts.
//
// Where the policy cannot be set (no CAP_SYS_NICE, a cgroup with no
// real-time budget), operations run on the thread as they are and RT says
// why: the kernel may then skip programs, and program_skipped counts it.
type MapOps struct {
	ops  chan mapOp
	stop chan struct{}
	done chan struct{}
	once sync.Once
	rt   error // why the thread is not SCHED_FIFO, nil when it is
	want bool  // it was asked to be
}

type mapOp struct {
	f   func() error
	err chan error
}

// ErrMapOpsClosed is returned by Do after Close.
var ErrMapOpsClosed = errors.New("the map thread has stopped")

// NewMapOps starts the thread. realtime asks for SCHED_FIFO (the kernel
// preempts in kernel mode: Preemption.Preempts).
func NewMapOps(realtime bool) *MapOps {
	m := &MapOps{ops: make(chan mapOp), stop: make(chan struct{}), done: make(chan struct{}), want: realtime}
	ready := make(chan error)
	go m.run(realtime, ready)
	m.rt = <-ready
	return m
}

func (m *MapOps) run(realtime bool, ready chan<- error) {
	// Locked for good: the thread ends with the goroutine, so its policy
	// never reaches another goroutine.
	runtime.LockOSThread()
	defer close(m.done)
	var err error
	if realtime {
		err = setFIFO()
	}
	ready <- err
	for {
		select {
		case op := <-m.ops:
			op.err <- op.f()
		case <-m.stop:
			return
		}
	}
}

func setFIFO() error {
	attr := &unix.SchedAttr{
		Size:     unix.SizeofSchedAttr,
		Policy:   unix.SCHED_FIFO,
		Priority: 1,
		Flags:    unix.SCHED_FLAG_RESET_ON_FORK,
	}
	if err := unix.SchedSetAttr(0, attr, 0); err != nil {
		return fmt.Errorf("sched_setattr(SCHED_FIFO) for the map thread: %w (needs CAP_SYS_NICE and a real-time budget)", err)
	}
	return nil
}

// Do runs f on the thread and returns its error. f must only do map
// operations (and what they need): it holds up every other caller.
func (m *MapOps) Do(f func() error) error {
	if m == nil {
		return f()
	}
	op := mapOp{f: f, err: make(chan error, 1)}
	select {
	case m.ops <- op:
		return <-op.err
	case <-m.stop:
		return ErrMapOpsClosed
	}
}

// RealTime reports whether the thread runs SCHED_FIFO, and if it was asked
// to and does not, why.
func (m *MapOps) RealTime() (bool, error) {
	if m == nil || !m.want {
		return false, nil
	}
	return m.rt == nil, m.rt
}

// Close stops the thread once the operation in progress is done.
func (m *MapOps) Close() {
	if m == nil {
		return
	}
	m.once.Do(func() { close(m.stop) })
	<-m.done
}

// MapDo runs f on the tracer's map thread (MapOps): for map operations other
// packages make on its maps at run time (injection's trace contexts, the
// Python link diagnostics).
func (t *Tracer) MapDo(f func() error) error { return t.ops.Do(f) }
