//go:build linux

package http

import (
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Clock converts the kernel's bpf_ktime_get_ns() timestamps (CLOCK_MONOTONIC)
// to wall-clock time. NTP slews both clocks alike, so their offset moves
// only when the wall clock is stepped (settimeofday, an NTP step at boot, a
// VM resumed from a snapshot): Follow then takes the new one, so that span
// times stay on the clock the traced programs (and Gym's own spans) read.
// A span's start and end are converted together, when it is emitted, so a
// step never bends its duration.
type Clock struct {
	offset atomic.Int64 // CLOCK_REALTIME - CLOCK_MONOTONIC, ns
	// bracket: the two monotonic reads around the realtime read the
	// offset came from, ns apart; the offset is within half of it.
	bracket atomic.Int64
}

// NewClock reads the offset of CLOCK_REALTIME from CLOCK_MONOTONIC (Resync).
func NewClock() (*Clock, error) {
	c := &Clock{}
	if err := c.Resync(); err != nil {
		return nil, err
	}
	return c, nil
}

// NewClockWithOffset is a Clock with a fixed realtime-minus-monotonic offset,
// for tests and replays.
func NewClockWithOffset(offset time.Duration) *Clock {
	c := &Clock{}
	c.offset.Store(int64(offset))
	return c
}

// A thread switched out between two clock reads (a busy machine, a guest's
// one vCPU, Go preempting the goroutine) widens that sample's bracket by its
// time away, and the offset is off by half of that for every span: one
// sample taken while gymtrace attached in a loaded 5.10 guest moved every
// span about 9 ms late, and a short handler's span then started after the
// handler had ended. So up to resyncTries samples are read, stopping at one
// bracketed within resyncGood, and the narrowest is kept.
const (
	resyncTries = 32
	resyncGood  = 20 * time.Microsecond
)

// clockSample is one bracketed read: monotonic, realtime, monotonic.
type clockSample struct{ m1, r, m2 int64 }

// offset pairs the realtime read with the midpoint of its bracket.
func (s clockSample) offset() int64 { return s.r - (s.m1+s.m2)/2 }

// bracket is how far apart the two monotonic reads were.
func (s clockSample) bracket() int64 { return s.m2 - s.m1 }

// Resync re-reads the offset: the realtime read is bracketed by two monotonic
// reads and paired with their midpoint; of several such samples the one with
// the narrowest bracket is kept (well under a microsecond on an idle machine).
func (c *Clock) Resync() error {
	return c.resyncFrom(readClocks)
}

func (c *Clock) resyncFrom(read func() (clockSample, error)) error {
	best, err := bestSample(read)
	if err != nil {
		return err
	}
	c.take(best)
	return nil
}

// take makes sample s the clock's offset.
func (c *Clock) take(s clockSample) {
	c.offset.Store(s.offset())
	c.bracket.Store(s.bracket())
}

// bestSample reads up to resyncTries samples, stopping at one bracketed
// within resyncGood, and returns the narrowest.
func bestSample(read func() (clockSample, error)) (clockSample, error) {
	best := clockSample{}
	for i := 0; i < resyncTries; i++ {
		s, err := read()
		if err != nil {
			return clockSample{}, err
		}
		if i == 0 || s.bracket() < best.bracket() {
			best = s
		}
		if best.bracket() <= int64(resyncGood) {
			break
		}
	}
	return best, nil
}

// stepMin is the least move of the offset Follow takes for a step: far
// above a sample's error (a bracket within resyncGood, or a few µs on a busy
// machine), far below a step anyone would see in a trace.
const stepMin = time.Millisecond

// Follow re-reads the offset and takes the new one when the wall clock was
// stepped by stepMin or more since it was last read; it returns the step (0:
// none). A sample whose bracket is too wide to tell a step from a thread
// switched out is not used: the next call reads again. Call it now and then
// (the agent does, every second); a span emitted between a step and the next
// call has the old offset.
func (c *Clock) Follow() (time.Duration, error) {
	return c.followFrom(readClocks)
}

func (c *Clock) followFrom(read func() (clockSample, error)) (time.Duration, error) {
	best, err := bestSample(read)
	if err != nil {
		return 0, err
	}
	if best.bracket() > int64(stepMin)/4 {
		return 0, nil
	}
	step := best.offset() - c.offset.Load()
	if step > -int64(stepMin) && step < int64(stepMin) {
		return 0, nil
	}
	c.take(best)
	return time.Duration(step), nil
}

func readClocks() (clockSample, error) {
	var m1, r, m2 unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1); err != nil {
		return clockSample{}, fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &r); err != nil {
		return clockSample{}, fmt.Errorf("reading CLOCK_REALTIME: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2); err != nil {
		return clockSample{}, fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
	}
	return clockSample{m1.Nano(), r.Nano(), m2.Nano()}, nil
}

// Uncertainty bounds the offset's error: half the kept sample's bracket.
// Every span's wall-clock start and end share it (durations do not).
func (c *Clock) Uncertainty() time.Duration { return time.Duration(c.bracket.Load() / 2) }

// Wall converts a CLOCK_MONOTONIC timestamp in ns to wall-clock time.
func (c *Clock) Wall(mono uint64) time.Time {
	return time.Unix(0, int64(mono)+c.offset.Load())
}

// NowMono reads CLOCK_MONOTONIC now, in the kernel's units.
func (c *Clock) NowMono() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; fall back to the offset clock.
		return uint64(time.Now().UnixNano() - c.offset.Load())
	}
	return uint64(ts.Nano())
}
