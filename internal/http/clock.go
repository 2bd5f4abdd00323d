//go:build linux

package http

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Clock converts the kernel's bpf_ktime_get_ns() timestamps (CLOCK_MONOTONIC)
// to wall-clock time. The offset between the two clocks is read once: NTP
// slews both alike, and a stepped wall clock should not bend span durations.
// Call Resync after a known clock step if absolute times must follow it.
type Clock struct {
	offset int64 // CLOCK_REALTIME - CLOCK_MONOTONIC, ns
	// bracket: the two monotonic reads around the realtime read the
	// offset came from, ns apart; the offset is within half of it.
	bracket int64
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
func NewClockWithOffset(offset time.Duration) *Clock { return &Clock{offset: int64(offset)} }

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

// Resync re-reads the offset: the realtime read is bracketed by two monotonic
// reads and paired with their midpoint; of several such samples the one with
// the narrowest bracket is kept (well under a microsecond on an idle machine).
func (c *Clock) Resync() error {
	return c.resyncFrom(readClocks)
}

func (c *Clock) resyncFrom(read func() (clockSample, error)) error {
	best := clockSample{}
	for i := 0; i < resyncTries; i++ {
		s, err := read()
		if err != nil {
			return err
		}
		if i == 0 || s.m2-s.m1 < best.m2-best.m1 {
			best = s
		}
		if best.m2-best.m1 <= int64(resyncGood) {
			break
		}
	}
	c.offset = best.r - (best.m1+best.m2)/2
	c.bracket = best.m2 - best.m1
	return nil
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
func (c *Clock) Uncertainty() time.Duration { return time.Duration(c.bracket / 2) }

// Wall converts a CLOCK_MONOTONIC timestamp in ns to wall-clock time.
func (c *Clock) Wall(mono uint64) time.Time {
	return time.Unix(0, int64(mono)+c.offset)
}

// NowMono reads CLOCK_MONOTONIC now, in the kernel's units.
func (c *Clock) NowMono() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; fall back to the offset clock.
		return uint64(time.Now().UnixNano() - c.offset)
	}
	return uint64(ts.Nano())
}
