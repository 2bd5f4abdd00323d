//go:build linux

package agent

import (
	"io"
	"log/slog"
	"sync"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// closer closes the probes of exited targets in the background, in order.
// Detaching a uprobe waits for the kernel (a grace period per link, more
// under load): done on discovery's goroutine, three exits in a row kept a
// server started meanwhile untraced for 3 s (TestLateStarters). Batches
// queued together are closed together, their waits overlapping.
type closer struct {
	mu      sync.Mutex
	stopped bool
	ch      chan []io.Closer
	done    chan struct{}
	log     *slog.Logger
}

func newCloser(log *slog.Logger) *closer {
	c := &closer{ch: make(chan []io.Closer, 1024), done: make(chan struct{}), log: log}
	go func() {
		defer close(c.done)
		for cs := range c.ch {
			c.closeAll(append(cs, c.queued()...))
		}
	}()
	return c
}

// queued takes the batches waiting now.
func (c *closer) queued() []io.Closer {
	var out []io.Closer
	for {
		select {
		case cs, ok := <-c.ch:
			if !ok {
				return out
			}
			out = append(out, cs...)
		default:
			return out
		}
	}
}

// add queues cs; with the queue full, or the closer stopped, it closes them
// now.
func (c *closer) add(cs []io.Closer) {
	if len(cs) == 0 {
		return
	}
	c.mu.Lock()
	if !c.stopped {
		select {
		case c.ch <- cs:
			c.mu.Unlock()
			return
		default:
		}
	}
	c.mu.Unlock()
	c.closeAll(cs)
}

func (c *closer) closeAll(cs []io.Closer) {
	if err := probesite.CloseAll(cs); err != nil {
		c.log.Debug("detaching an exited target's probes", "err", err)
	}
}

// stop closes what is queued and returns when it is done. What is added
// after is closed at once, by add's caller. Calling it again waits again.
func (c *closer) stop() {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		close(c.ch)
	}
	c.mu.Unlock()
	<-c.done
}
