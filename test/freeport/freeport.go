// Package freeport picks TCP ports for test servers that nothing else on the
// machine is about to take.
//
// bind(port 0) hands out a port from the kernel's ephemeral range
// (net.ipv4.ip_local_port_range). The port is free when it is returned, but
// between closing the probe socket and the server's own bind any outbound
// connect() on the machine may be given the same port as its source port, and
// the server then fails with EADDRINUSE. CI runs test packages in parallel, so
// that happened (a Python server in internal/python never listened). Ports
// below the ephemeral range are never handed out by connect(), so the only
// way to lose one is another test picking the very same port in the same few
// milliseconds, which the random choice makes negligible. Within one process
// Pick never returns the same port twice: the probe socket is closed when it
// returns, so two picks for servers not yet started could otherwise be the
// same port (one server then answers for the other).
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// given are the ports this process was handed.
var given struct {
	sync.Mutex
	ports map[int]bool
}

// take marks p handed out; false when it was already.
func take(p int) bool {
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	if given.ports[p] {
		return false
	}
	given.ports[p] = true
	return true
}

const (
	lowest = 10000 // below this live well-known services
	tries  = 200
)

// Pick returns a TCP port on 127.0.0.1 outside the ephemeral range that was
// free a moment ago.
func Pick() (int, error) {
	lo, hi := ephemeralRange()
	for range tries {
		p := candidate(lo, hi)
		if p == 0 {
			break
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		if take(p) {
			return p, nil
		}
	}
	// No room outside the ephemeral range (a machine that made it cover
	// almost everything): fall back to the kernel's choice.
	for range tries {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free TCP port on 127.0.0.1: %w", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if take(p) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("finding a free TCP port on 127.0.0.1: every port tried was handed out before")
}

// candidate is a random port in [lowest, 65535] outside [lo, hi], or 0 when
// there is none.
func candidate(lo, hi int) int {
	below := max(0, min(lo, 65536)-lowest) // [lowest, lo)
	from := max(hi+1, lowest)              // (hi, 65535]
	above := max(0, 65536-from)
	if below+above == 0 {
		return 0
	}
	i := rand.IntN(below + above)
	if i < below {
		return lowest + i
	}
	return from + i - below
}

// ephemeralRange is the kernel's ip_local_port_range, or Linux's default.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l > h {
		return lo, hi
	}
	return l, h
}
