//go:build linux

package agent

import (
	"io"
	"log/slog"
)

// closer closes the probes of exited targets in the background, in order.
// Detaching a uprobe waits for the kernel (about a second each on a loaded
// 2-core machine): done on discovery's goroutine, three exits in a row kept
// a server started meanwhile untraced for 3 s (TestLateStarters).
type closer struct {
	ch   chan []io.Closer
	done chan struct{}
	log  *slog.Logger
}

func newCloser(log *slog.Logger) *closer {
	c := &closer{ch: make(chan []io.Closer, 1024), done: make(chan struct{}), log: log}
	go func() {
		defer close(c.done)
		for cs := range c.ch {
			c.closeAll(cs)
		}
	}()
	return c
}

// add queues cs; with the queue full it closes them now.
func (c *closer) add(cs []io.Closer) {
	if len(cs) == 0 {
		return
	}
	select {
	case c.ch <- cs:
	default:
		c.closeAll(cs)
	}
}

func (c *closer) closeAll(cs []io.Closer) {
	for _, x := range cs {
		if err := x.Close(); err != nil {
			c.log.Debug("detaching an exited target's probes", "err", err)
		}
	}
}

// stop closes what is queued and returns when it is done. Nothing may be
// added after.
func (c *closer) stop() {
	close(c.ch)
	<-c.done
}
