//go:build linux

package agent

import (
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// The pure-server rule: probes come off only after pureAnswered answers, no
// call and pureGrace; any call puts them back, and the grace starts over.
func TestPureWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var w pureWatch
	steps := []struct {
		n    spans.ReqCounts
		at   time.Duration
		want pureStep
	}{
		// An agent: a burst of requests read, none answered yet, no call
		// recorded yet: never pure, however long.
		{spans.ReqCounts{Served: 64}, 0, pureKeep},
		{spans.ReqCounts{Served: 64}, 10 * time.Second, pureKeep},
		// Answers without calls: pure from here, off after the grace.
		{spans.ReqCounts{Served: 64, Answered: pureAnswered}, 11 * time.Second, pureKeep},
		{spans.ReqCounts{Served: 64, Answered: 40}, 11*time.Second + pureGrace - time.Millisecond, pureKeep},
		{spans.ReqCounts{Served: 64, Answered: 40}, 11*time.Second + pureGrace, pureDetach},
		{spans.ReqCounts{Served: 99, Answered: 99}, 20 * time.Second, pureKeep},
		// Its first call: back on, once.
		{spans.ReqCounts{Served: 99, Answered: 99, Made: 1}, 21 * time.Second, pureReattach},
		{spans.ReqCounts{Served: 99, Answered: 99, Made: 1}, 22 * time.Second, pureKeep},
		{spans.ReqCounts{Served: 999, Answered: 999, Made: 1}, 99 * time.Second, pureKeep},
	}
	for i, s := range steps {
		if got := w.step(s.n, at(s.at)); got != s.want {
			t.Fatalf("step %d (%+v at %v) = %d, want %d", i, s.n, s.at, got, s.want)
		}
	}
	// A process that calls before the grace ends never goes off.
	var v pureWatch
	if got := v.step(spans.ReqCounts{Answered: 50}, at(0)); got != pureKeep {
		t.Fatalf("first look = %d", got)
	}
	if got := v.step(spans.ReqCounts{Answered: 60, Made: 1}, at(pureGrace/2)); got != pureKeep {
		t.Fatalf("call within the grace = %d", got)
	}
	if got := v.step(spans.ReqCounts{Answered: 90, Made: 1}, at(10*pureGrace)); got != pureKeep {
		t.Fatalf("a calling process went off: %d", got)
	}
}
