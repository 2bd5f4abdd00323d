//go:build linux

package agent

import (
	"io"
	"log/slog"
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

// An exited target's probes are closed after add returns, in order, and
// stop waits for all of them.
func TestCloserInBackground(t *testing.T) {
	var mu sync.Mutex
	var order []int
	gate := make(chan struct{})
	c := newCloser(slog.Default())
	c.add([]io.Closer{slowCloser{&mu, &order, 1, gate}, slowCloser{&mu, &order, 2, nil}})
	c.add([]io.Closer{slowCloser{&mu, &order, 3, nil}})
	c.add(nil)
	// add returned while the first close still waits: nothing closed yet.
	mu.Lock()
	if len(order) != 0 {
		t.Errorf("closed before the slow close finished: %v", order)
	}
	mu.Unlock()
	close(gate)
	c.stop()
	if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 3 {
		t.Errorf("closed %v, want [1 2 3]", order)
	}
}
