//go:build linux

package loader

import (
	"errors"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMapOpsOneThread: every operation runs on the same OS thread, errors
// come back to the caller, and after Close nothing runs.
func TestMapOpsOneThread(t *testing.T) {
	m := NewMapOps(false)
	if rt, why := m.RealTime(); rt || why != nil {
		t.Fatalf("RealTime() = %v, %v for a thread not asked to be real-time", rt, why)
	}
	tids := map[int]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = m.Do(func() error {
				mu.Lock()
				tids[unix.Gettid()] = true
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	if len(tids) != 1 {
		t.Errorf("operations ran on %d threads, want 1", len(tids))
	}
	want := errors.New("map full")
	if err := m.Do(func() error { return want }); err != want {
		t.Errorf("Do returned %v, want the operation's error", err)
	}
	m.Close()
	ran := false
	if err := m.Do(func() error { ran = true; return nil }); !errors.Is(err, ErrMapOpsClosed) || ran {
		t.Errorf("after Close: Do returned %v and ran=%v, want ErrMapOpsClosed and nothing run", err, ran)
	}
	m.Close() // twice is fine

	var nilOps *MapOps
	if err := nilOps.Do(func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("a nil MapOps: Do returned %v and ran=%v, want the operation run in place", err, ran)
	}
}

// TestMapOpsRealTime: asked to, the thread runs SCHED_FIFO (as root), with
// SCHED_RESET_ON_FORK so threads it starts do not; the caller's thread keeps
// its own policy.
func TestMapOpsRealTime(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_NICE) to set SCHED_FIFO")
	}
	m := NewMapOps(true)
	defer m.Close()
	if rt, why := m.RealTime(); !rt {
		t.Fatalf("the map thread is not SCHED_FIFO: %v", why)
	}
	var attr *unix.SchedAttr
	if err := m.Do(func() error {
		var err error
		attr, err = unix.SchedGetAttr(0, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if attr.Policy != unix.SCHED_FIFO || attr.Priority != 1 || attr.Flags&unix.SCHED_FLAG_RESET_ON_FORK == 0 {
		t.Errorf("map thread: policy %d priority %d flags %#x, want SCHED_FIFO (%d) at 1 with SCHED_RESET_ON_FORK", attr.Policy, attr.Priority, attr.Flags, unix.SCHED_FIFO)
	}
	if own, err := unix.SchedGetAttr(0, 0); err != nil || own.Policy == unix.SCHED_FIFO {
		t.Errorf("the calling thread's policy is %v (%v): only the map thread may be real-time", own, err)
	}
}
