//go:build linux

package loader

// Reading the ring buffer: records wait there without waking the reader, and
// the reader drains them on a timer or when a quarter of the buffer is full.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// PollInterval bounds how long a record waits in the ring buffer while
// records flow: records are submitted without waking the reader (a wakeup
// costs the traced syscall microseconds), so the reader looks every
// PollInterval, and at once when a quarter of the buffer is pending. After a
// poll that found nothing the interval doubles, up to MaxPollInterval, so an
// idle agent does not wake a hundred times a second; the first record resets
// it. Nothing waits on a record's latency but export (batched anyway):
// traces for injection are published by the kernel itself, and process
// events wake the reader.
const (
	PollInterval    = 100 * time.Millisecond
	MaxPollInterval = 400 * time.Millisecond
)

// pastDeadline makes the ring-buffer reader's ReadInto return
// os.ErrDeadlineExceeded as soon as the ring is empty: it never blocks.
var pastDeadline = time.Unix(1, 0)

// Read delivers ring-buffer records to fn until ctx ends or the tracer is
// closed; when ctx ends, what is already in the buffer is delivered first,
// and nothing written after. Each drain takes what the ring holds when it
// starts: under load the traced processes refill the ring as fast as it
// drains, and a drain "until empty" need never end, nor see ctx end.
// The slice passed to fn is reused: fn must copy what it keeps.
//
// Between drains the reader waits in Go's scheduler (a timer, the kernel's
// wakeups through the netpoller, ctx), never in a blocking epoll_wait: a
// goroutine parked in a syscall keeps its P busy, and Go's sysmon thread
// then keeps waking (hundreds of times a second here) to take the P back,
// which on a machine shared with the traced servers is their CPU.
func (t *Tracer) Read(ctx context.Context, fn func(raw []byte)) error {
	var rec ringbuf.Record
	t.rd.SetDeadline(pastDeadline)
	wake := t.wakeups()
	base := PollInterval
	if t.pollEvery > 0 {
		base = t.pollEvery
	}
	interval := base
	timer := time.NewTimer(interval)
	defer timer.Stop()
	last := func() error {
		n, closed := t.available()
		if closed {
			return nil
		}
		_, err := t.drain(&rec, fn, n)
		_, err = readEnd(err)
		return err
	}
	// A lagging reader (tests of loss) reads at least lagEvery records after
	// each overflow, then falls behind again while the ring's refusals are
	// under their share (lagDue).
	sinceLoss := lagEvery
	var delivered, refused0 uint64
	if t.lagging {
		refused0 = t.refused()
		read := fn
		fn = func(raw []byte) { sinceLoss++; delivered++; read(raw) }
	}
	for {
		// sinceLoss first: the kernel's counter is read only when the
		// reader may lag again, not at every drain.
		if t.lagging && sinceLoss >= lagEvery && lagDue(sinceLoss, t.refused()-refused0, delivered) {
			lost, done := t.lag(ctx)
			if done {
				return last()
			}
			if lost {
				sinceLoss = 0
			}
		}
		n, closed := t.available()
		if closed {
			return nil
		}
		got, err := t.drain(&rec, fn, n)
		if done, err := readEnd(err); done {
			return err
		}
		if ctx.Err() != nil {
			return last()
		}
		if got {
			interval = base
		}
		if n, _ := t.available(); n > 0 {
			continue // written while this drain ran
		}
		if t.drained != nil {
			t.drained()
		}
		select {
		case <-ctx.Done():
			return last()
		case <-wake:
		case <-timer.C:
			if !got && t.pollEvery == 0 {
				interval = max(min(2*interval, MaxPollInterval), base)
			}
			timer.Reset(interval)
		}
	}
}

// A lagging reader looks at the ring and the kernel's loss counter every
// lagPoll, calls the traffic paused after lagQuiet polls with the ring
// unchanged, and reads lagEvery records between overflows, and on until the
// ring has refused at most lagShare of the records so far.
const (
	lagPoll  = 2 * time.Millisecond
	lagQuiet = 5
	lagEvery = 1024
	lagShare = 0.05
)

// lagDue says whether a lagging reader falls behind again: it has read
// lagEvery records since the last overflow, and the ring has refused less
// than lagShare of the records it was offered since Read began (refused
// ones, and delivered ones, written late or not). Loss is a test
// condition (issue 37: a ring that loses 1 to 10 % of records): a reader
// that lagged after every lagEvery records lost as much as the machine let
// it (how long the reader stays off the CPU after an overflow), 2 % on an
// idle machine and 41 % of one case beside a kernel-matrix guest (CI of
// f7f0b7d). Holding the share near lagShare makes the condition the same
// on a quiet and a busy machine; a reader that cannot keep up even when it
// does not lag loses more, and the test says so.
func lagDue(sinceLoss int, refused, delivered uint64) bool {
	if sinceLoss < lagEvery {
		return false
	}
	return refused == 0 || float64(refused) < lagShare*float64(refused+delivered)
}

// lag holds the next drain back, as a reader that has fallen behind, until
// the kernel counts a record it could not reserve (the ring overflowed:
// lost), or the ring has stopped filling for lagQuiet polls (the traffic
// paused: what the ring holds must not wait for traffic that may never
// come). done: ctx ended or the tracer closed.
//
// Tests of loss (GYMTRACE_TEST_LAGGING_READER=1) need the loss to happen:
// a reader that keeps up (a quiet machine, the kernel's wakeup at a quarter
// full) lets a small-ring test lose nothing and prove nothing. Lagging makes
// the ring overflow wherever the traffic outruns it, in short bursts
// (records arriving in the poll after the overflow) spread over the run.
func (t *Tracer) lag(ctx context.Context) (lost, done bool) {
	from := t.refused()
	tick := time.NewTicker(lagPoll)
	defer tick.Stop()
	prev, still := -1, 0
	for {
		select {
		case <-ctx.Done():
			return false, true
		case <-tick.C:
		}
		n, closed := t.available()
		switch {
		case closed:
			return false, true
		case t.refused() > from:
			return true, false
		case n != prev:
			prev, still = n, 0
		default:
			if still++; still >= lagQuiet {
				return false, false
			}
		}
	}
}

// refused is the kernel's count of records the ring refused (full, or a
// response shed while crowded): one counter, not all of Stats, as the
// lagging reader reads it every lagPoll.
func (t *Tracer) refused() (n uint64) {
	t.ops.Do(func() (err error) {
		n, err = perCPUSum(t.objs.GtStats, StatRingbufFull, &t.lagPer)
		return err
	})
	return n
}

// readEnd says whether a drain's error ends Read, and with what.
func readEnd(err error) (bool, error) {
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed):
		return true, nil
	default:
		return true, fmt.Errorf("reading the ring buffer: %w", err)
	}
}

// ringbufHeader is a record's header in the ring (BPF_RINGBUF_HDR_SZ).
const ringbufHeader = 8

// drain delivers the records in the ring, until it is empty or the records
// delivered took budget bytes of it (header and 8-byte padding included;
// the kernel's discarded records are skipped unseen and not counted, so it
// may read a little further); got: at least one.
func (t *Tracer) drain(rec *ringbuf.Record, fn func(raw []byte), budget int) (got bool, err error) {
	for budget > 0 {
		err := t.rd.ReadInto(rec)
		switch {
		case err == nil:
			got = true
			fn(rec.RawSample)
			budget -= ringbufHeader + (len(rec.RawSample)+7)&^7
		case errors.Is(err, os.ErrDeadlineExceeded):
			return got, nil
		default:
			return got, err
		}
	}
	return got, nil
}

// wakeups returns a channel that gets a value when the kernel wakes the ring
// buffer's readers (a forced wakeup: process events, a full quarter).
// The wait is a non-blocking duplicate of the ring's fd in Go's netpoller,
// started once per tracer. Where the netpoller cannot take the fd, nothing
// is ever sent and the reader relies on its poll interval alone.
func (t *Tracer) wakeups() <-chan struct{} {
	t.wakeOnce.Do(func() {
		t.wakeCh = make(chan struct{}, 1)
		if t.wakeFile == nil {
			return
		}
		rc, err := t.wakeFile.SyscallConn()
		if err != nil {
			t.log.Debug("ring-buffer wakeups unavailable: polling only", "err", err)
			return
		}
		notify := func() {
			select {
			case t.wakeCh <- struct{}{}:
			default: // one pending wakeup is enough
			}
		}
		go func() {
			// The callback runs at every readiness edge (the netpoller's
			// epoll is edge-triggered, and the kernel wakes the ring's
			// wait queue once per forced wakeup) and returns false to
			// wait for the next. It ends when the file is closed.
			err := rc.Read(func(uintptr) bool { notify(); return false })
			if err != nil && !errors.Is(err, os.ErrClosed) {
				t.log.Debug("ring-buffer wakeups stopped: polling only", "err", err)
			}
			// Closed (Close closes the ring first): one last wakeup, so
			// a waiting Read sees the closed ring now rather than at its
			// next timer.
			notify()
		}()
	})
	return t.wakeCh
}

// newWakeFile duplicates the ring buffer's fd as a non-blocking *os.File,
// which Go registers with its netpoller (a ring buffer map fd is pollable:
// readable when records are pending).
func newWakeFile(fd int) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return nil, err
	}
	return os.NewFile(uintptr(nfd), "gymtrace-ringbuf"), nil
}

// Pending is the number of bytes in the ring buffer not read yet: 0 means
// the reader has caught up with the kernel.
func (t *Tracer) Pending() int {
	n, _ := t.available()
	return n
}

// available is how many bytes the ring holds unread, and whether the
// tracer is closed.
func (t *Tracer) available() (int, bool) {
	t.rdMu.RLock()
	defer t.rdMu.RUnlock()
	if t.rdClosed {
		return 0, true
	}
	return t.rd.AvailableBytes(), false
}
