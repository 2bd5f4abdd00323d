package metrics

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Snapshot is what the status line shows; counts are cumulative, the line
// turns them into rates.
type Snapshot struct {
	Targets int
	Spans   map[string]uint64 // spans built per group
	Drops   uint64            // everything lost: ring-buffer failures, export drops and failures
	Gym     GymSummary        // Gym's metrics; zero when they are off
}

// GymSummary is what the status line shows of Gym's metrics; the fields
// match gymmetrics.Summary.
type GymSummary struct {
	Rollouts               uint64        // rollouts finished
	RolloutP50, RolloutP99 time.Duration // over the recent ones
	VerifyOK, VerifyAll    uint64        // /verify calls that succeeded, and all
}

// groupOrder is the order groups appear in, Gym's table order; others follow
// sorted.
var groupOrder = []string{"job", "server", "http_client", "rollout", "agent", "model_call", "verify", "sandbox",
	"checkpoint", "step", "optimizer"}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool { return f != nil && isTerminalFd(f.Fd()) }

// Render formats one status line from two snapshots elapsed apart, cut to
// width columns (0: no limit).
func Render(prev, cur Snapshot, elapsed time.Duration, width int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "targets %d | spans/s", cur.Targets)
	groups := make([]string, 0, len(cur.Spans))
	for g := range cur.Spans {
		groups = append(groups, g)
	}
	rank := func(g string) int {
		if i := slices.Index(groupOrder, g); i >= 0 {
			return i
		}
		return len(groupOrder)
	}
	slices.SortFunc(groups, func(a, c string) int {
		if ra, rc := rank(a), rank(c); ra != rc {
			return ra - rc
		}
		return strings.Compare(a, c)
	})
	if len(groups) == 0 {
		b.WriteString(" -")
	}
	secs := elapsed.Seconds()
	for _, g := range groups {
		rate := 0.0
		if d := cur.Spans[g] - prev.Spans[g]; secs > 0 && cur.Spans[g] >= prev.Spans[g] {
			rate = float64(d) / secs
		}
		if rate < 10 && rate != float64(int(rate)) {
			fmt.Fprintf(&b, " %s %.1f", g, rate)
		} else {
			fmt.Fprintf(&b, " %s %.0f", g, rate)
		}
	}
	if g := cur.Gym; g.Rollouts > 0 {
		rate := 0.0
		if secs > 0 && g.Rollouts >= prev.Gym.Rollouts {
			rate = float64(g.Rollouts-prev.Gym.Rollouts) / secs
		}
		fmt.Fprintf(&b, " | rollouts/s %.1f p50 %s p99 %s", rate, shortDur(g.RolloutP50), shortDur(g.RolloutP99))
	}
	if g := cur.Gym; g.VerifyAll > 0 {
		fmt.Fprintf(&b, " | verify ok %.1f%%", 100*float64(g.VerifyOK)/float64(g.VerifyAll))
	}
	fmt.Fprintf(&b, " | drops %d", cur.Drops)
	s := b.String()
	if width > 0 && utf8.RuneCountInString(s) > width-1 {
		// One column spare: writing the last column makes some terminals wrap.
		r := []rune(s)
		s = string(r[:max(width-2, 0)]) + "…"
	}
	return s
}

// shortDur prints d with three significant figures: 850ms, 1.25s, 72.4s.
func shortDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
}

// StatusLine keeps a one-line live status at the bottom of a terminal. Other
// output meant for the same terminal (the trace trees) goes through its
// Write, which lifts the line out of the way and puts it back after.
type StatusLine struct {
	out      io.Writer
	fd       uintptr
	active   bool
	snapshot func() Snapshot

	mu      sync.Mutex
	line    string // what is drawn now
	midLine bool   // the last Write did not end in a newline
}

// NewStatusLine draws on out when out is a terminal; otherwise it only passes
// writes through and Run returns at once.
func NewStatusLine(out *os.File, snapshot func() Snapshot) *StatusLine {
	s := &StatusLine{out: out, snapshot: snapshot}
	if out != nil {
		s.fd = out.Fd()
		s.active = isTerminalFd(s.fd)
	}
	return s
}

// Active reports whether the line is drawn (out is a terminal).
func (s *StatusLine) Active() bool { return s.active }

// Run redraws the line every interval until ctx ends, then erases it.
func (s *StatusLine) Run(ctx context.Context, interval time.Duration) {
	if !s.active || s.snapshot == nil {
		return
	}
	if interval <= 0 {
		interval = time.Second
	}
	prev, at := s.snapshot(), time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.eraseLocked()
			s.line = ""
			s.mu.Unlock()
			return
		case now := <-tick.C:
			cur := s.snapshot()
			line := Render(prev, cur, now.Sub(at), termWidth(s.fd))
			prev, at = cur, now
			s.mu.Lock()
			s.line = line
			if !s.midLine {
				s.eraseLocked()
				io.WriteString(s.out, line)
			}
			s.mu.Unlock()
		}
	}
}

// Write prints p above the status line.
func (s *StatusLine) Write(p []byte) (int, error) {
	if !s.active {
		return s.out.Write(p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.midLine {
		s.eraseLocked()
	}
	n, err := s.out.Write(p)
	s.midLine = len(p) > 0 && p[len(p)-1] != '\n'
	if !s.midLine && s.line != "" {
		io.WriteString(s.out, s.line)
	}
	return n, err
}

func (s *StatusLine) eraseLocked() {
	if s.line != "" {
		io.WriteString(s.out, "\r\x1b[K")
	}
}
