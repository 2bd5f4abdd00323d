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
}

// NewClock reads CLOCK_MONOTONIC and CLOCK_REALTIME once.
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

// Resync re-reads the offset. The realtime read is bracketed by two monotonic
// reads and paired with their midpoint, which bounds the error by half the
// bracket (well under a microsecond).
func (c *Clock) Resync() error {
	var m1, r, m2 unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1); err != nil {
		return fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &r); err != nil {
		return fmt.Errorf("reading CLOCK_REALTIME: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &m2); err != nil {
		return fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
	}
	mid := (m1.Nano() + m2.Nano()) / 2
	c.offset = r.Nano() - mid
	return nil
}

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
