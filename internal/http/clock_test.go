//go:build linux

package http

import (
	"errors"
	"testing"
	"time"
)

// A sample whose thread was switched out between its reads is not the one
// kept: its offset would move every span by half the time away.
func TestResyncKeepsNarrowestBracket(t *testing.T) {
	const off = int64(1_800_000_000 * time.Second)
	ms := int64(time.Millisecond)
	samples := []clockSample{
		// Switched out for 18 ms after the realtime read: 9 ms off.
		{m1: 100 * ms, r: 100*ms + off, m2: 118 * ms},
		// Switched out 2 ms before it: 1 ms off the other way.
		{m1: 200 * ms, r: 202*ms + off, m2: 202 * ms},
		// 40 µs apart: 0 off, but wider than resyncGood, so reading goes on.
		{m1: 300 * ms, r: 300*ms + 20_000 + off, m2: 300*ms + 40_000},
		{m1: 400 * ms, r: 400*ms + 500 + off, m2: 400*ms + 1000},
		{m1: 500 * ms, r: 500*ms + off, m2: 500*ms + 90_000},
	}
	reads := 0
	c := &Clock{}
	err := c.resyncFrom(func() (clockSample, error) {
		s := samples[reads%len(samples)]
		reads++
		return s, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.offset.Load() != off {
		t.Errorf("offset %d ns off the true one, want 0 (the 1 µs sample's)", c.offset.Load()-off)
	}
	if reads != 4 {
		t.Errorf("%d samples read, want 4 (stop at the first within %v)", reads, resyncGood)
	}
	if u := c.Uncertainty(); u != 500*time.Nanosecond {
		t.Errorf("uncertainty %v, want 500ns", u)
	}
}

// With every sample wide, all resyncTries are read and the narrowest kept.
func TestResyncAllWide(t *testing.T) {
	reads := 0
	c := &Clock{}
	err := c.resyncFrom(func() (clockSample, error) {
		reads++
		w := int64(10_000_000 - reads*1000) // narrower each time
		return clockSample{m1: 0, r: 7 + w/2, m2: w}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if reads != resyncTries || c.offset.Load() != 7 {
		t.Errorf("reads %d, offset %d; want %d and 7", reads, c.offset.Load(), resyncTries)
	}
}

func TestResyncError(t *testing.T) {
	c := &Clock{}
	want := errors.New("no clock")
	if err := c.resyncFrom(func() (clockSample, error) { return clockSample{}, want }); !errors.Is(err, want) {
		t.Errorf("err %v, want %v", err, want)
	}
}

// A stepped wall clock moves the offset by the step; a sample's error (a
// wide bracket, a few µs of noise) does not.
func TestFollowTakesSteps(t *testing.T) {
	const off = int64(1_800_000_000 * time.Second)
	ms, us := int64(time.Millisecond), int64(time.Microsecond)
	c := NewClockWithOffset(time.Duration(off))
	for _, tc := range []struct {
		name       string
		s          clockSample
		step, want int64 // returned step, offset after
	}{
		{"noise", clockSample{m1: 10 * ms, r: 10*ms + 3*us + off, m2: 10*ms + 2*us}, 0, off},
		{"just under a step", clockSample{m1: 20 * ms, r: 20*ms + ms - us + off, m2: 20 * ms}, 0, off},
		{"stepped 30 ms ahead", clockSample{m1: 30 * ms, r: 60*ms + off, m2: 30 * ms}, 30 * ms, off + 30*ms},
		{"too wide to tell", clockSample{m1: 40 * ms, r: 40*ms + off, m2: 40*ms + ms}, 0, off + 30*ms},
		{"stepped back 5 s", clockSample{m1: 50 * ms, r: 50*ms + off + 30*ms - 5000*ms, m2: 50 * ms}, -5000 * ms, off + 30*ms - 5000*ms},
	} {
		s := tc.s
		step, err := c.followFrom(func() (clockSample, error) { return s, nil })
		if err != nil {
			t.Fatal(err)
		}
		if int64(step) != tc.step || c.offset.Load() != tc.want {
			t.Errorf("%s: step %v, offset %+d ns; want step %v, offset %+d ns", tc.name, step, c.offset.Load()-off,
				time.Duration(tc.step), tc.want-off)
		}
	}
	want := errors.New("no clock")
	if _, err := c.followFrom(func() (clockSample, error) { return clockSample{}, want }); !errors.Is(err, want) {
		t.Errorf("err %v, want %v", err, want)
	}
}
