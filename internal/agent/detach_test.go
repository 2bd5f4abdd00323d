//go:build linux

package agent

import (
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

type slowCloser struct {
	mu    *sync.Mutex
	order *[]int
	n     int
	gate  chan struct{}
}

func (s slowCloser) Close() error {
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	*s.order = append(*s.order, s.n)
	s.mu.Unlock()
	return nil
}

// An exited target's probes are closed after add returns, and stop waits
// for all of them; what is added after stop is closed at once.
func TestCloserInBackground(t *testing.T) {
	var mu sync.Mutex
	var order []int
	gate := make(chan struct{})
	c := newCloser(slog.Default())
	c.add([]io.Closer{slowCloser{&mu, &order, 1, gate}, slowCloser{&mu, &order, 2, nil}})
	c.add([]io.Closer{slowCloser{&mu, &order, 3, nil}})
	c.add(nil)
	// add returned while the first close still waits on its gate.
	mu.Lock()
	if slices.Contains(order, 1) {
		t.Errorf("the gated close finished before its gate opened: %v", order)
	}
	mu.Unlock()
	close(gate)
	c.stop()
	slices.Sort(order)
	if !slices.Equal(order, []int{1, 2, 3}) {
		t.Errorf("closed %v, want 1, 2 and 3", order)
	}
	c.add([]io.Closer{slowCloser{&mu, &order, 4, nil}})
	if !slices.Contains(order, 4) {
		t.Errorf("added after stop and not closed by add: %v", order)
	}
	c.stop() // again: harmless
}
