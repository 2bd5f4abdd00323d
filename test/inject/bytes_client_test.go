//go:build linux

package inject

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// runClient is the traced client (GYMTRACE_INJECT_CHILD=client): it waits
// for "go", runs the scenario's connections (four at a time, so several
// threads write at once) and prints {"ports": [...]}.
func runClient() int {
	var sc scenario
	b, err := os.ReadFile(os.Getenv("GYMTRACE_INJECT_SCENARIO"))
	if err == nil {
		err = json.Unmarshal(b, &sc)
	}
	if err != nil {
		fmt.Printf("{\"err\": %q}\n", err.Error())
		return 1
	}
	if _, err := io.ReadFull(os.Stdin, make([]byte, 3)); err != nil {
		return 1
	}
	ports := make([]int, len(sc.Conns))
	errs := make([]error, len(sc.Conns))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, cp := range sc.Conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ports[i], errs[i] = runConn(sc, cp)
		}()
	}
	wg.Wait()
	rep := struct {
		Ports []int  `json:"ports"`
		Err   string `json:"err,omitempty"`
	}{Ports: ports}
	for _, e := range errs {
		if e != nil {
			rep.Err = e.Error()
			break
		}
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	return 0
}

func runConn(sc scenario, cp connPlan) (int, error) {
	if cp.TLS {
		c, err := tls.Dial("tcp4", sc.TLSAddr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		for _, w := range cp.Writes {
			for _, b := range w.Bufs {
				if _, err := c.Write(b); err != nil {
					return 0, err
				}
			}
		}
		port := c.LocalAddr().(*net.TCPAddr).Port
		return port, c.CloseWrite()
	}
	c, err := net.Dial("tcp4", sc.Addr)
	if err != nil {
		return 0, err
	}
	tc := c.(*net.TCPConn)
	defer tc.Close()
	port := tc.LocalAddr().(*net.TCPAddr).Port
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0, err
	}
	for _, w := range cp.Writes {
		switch {
		case w.Mode == "write" && len(w.Bufs) == 1:
			_, err = tc.Write(w.Bufs[0])
		case w.Mode == "writev" || (w.Mode == "write" && len(w.Bufs) > 1):
			bufs := net.Buffers(append([][]byte{}, w.Bufs...))
			_, err = bufs.WriteTo(tc)
		default:
			err = sendAll(raw, w)
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", w.Mode, err)
		}
	}
	return port, tc.CloseWrite()
}

// sendAll sends w with sendto(2) or sendmsg(2) on the non-blocking socket,
// continuing partial sends (those continue mid-message: no header then).
func sendAll(raw syscall.RawConn, w writePlan) error {
	bufs := append([][]byte{}, w.Bufs...)
	var opErr error
	for len(bufs) > 0 {
		err := raw.Write(func(fd uintptr) bool {
			var n int
			var err error
			if w.Mode == "sendto" && len(bufs) == 1 {
				// unix.Sendto hides the count; a partial send matters here.
				r, _, e := unix.Syscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&bufs[0][0])), uintptr(len(bufs[0])), 0, 0, 0)
				n = int(r)
				if e != 0 {
					err = e
				}
			} else {
				n, err = unix.SendmsgBuffers(int(fd), bufs, nil, nil, 0)
			}
			if err == unix.EAGAIN {
				return false
			}
			if err != nil {
				opErr = err
				return true
			}
			for n > 0 && len(bufs) > 0 {
				if n >= len(bufs[0]) {
					n -= len(bufs[0])
					bufs = bufs[1:]
				} else {
					bufs[0] = bufs[0][n:]
					n = 0
				}
			}
			return true
		})
		if err != nil {
			return err
		}
		if opErr != nil {
			return opErr
		}
	}
	return nil
}
