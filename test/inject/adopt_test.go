//go:build linux

package inject

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runPreconnected (child): connects to GYMTRACE_INJECT_ADDR, prints its local
// port, waits for "go", then sends one request on that old connection.
func runPreconnected() int {
	c, err := net.Dial("tcp4", os.Getenv("GYMTRACE_INJECT_ADDR"))
	if err != nil {
		fmt.Println("err", err)
		return 1
	}
	defer c.Close()
	fmt.Println(c.LocalAddr().(*net.TCPAddr).Port)
	if _, err := io.ReadFull(os.Stdin, make([]byte, 3)); err != nil {
		return 1
	}
	if _, err := c.Write([]byte("GET /adopted HTTP/1.1\r\nHost: a\r\n\r\n")); err != nil {
		fmt.Println("err", err)
		return 1
	}
	c.(*net.TCPConn).CloseWrite()
	fmt.Println("done")
	return 0
}

// A connection made before the process became a target is not in the
// sockhash (sock_ops only sees new ones), so it gets no header, unless
// AdoptConnections puts it there: then its next request is injected.
func TestAdoptedConnectionIsInjected(t *testing.T) {
	needRoot(t)
	k := loadKernel(t, true)
	rec := newRecorder(t, false)
	for _, adopt := range []bool{false, true} {
		t.Run(fmt.Sprintf("adopt=%v", adopt), func(t *testing.T) {
			c := startChild(t, "preconnected", "GYMTRACE_INJECT_ADDR="+rec.addr())
			line, err := c.out.ReadString('\n')
			if err != nil {
				t.Fatalf("the child did not connect: %v", err)
			}
			port, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil {
				t.Fatalf("the child said %q", line)
			}
			// Established before it became a target.
			k.addTarget(t, c.pid())
			if adopt {
				n, err := k.inj.AdoptConnections(c.pid())
				if err != nil || n != 1 {
					t.Fatalf("AdoptConnections = %d, %v; want its one outbound connection", n, err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out, err := c.run(ctx); err != nil || strings.TrimSpace(out) != "done" {
				t.Fatalf("child: %q %v", out, err)
			}
			got := rec.wait(t, port)
			has := bytes.Contains(got, []byte("\r\ntraceparent: 00-"))
			if has != adopt {
				t.Fatalf("adopted=%v but traceparent injected=%v; the server got:\n%s", adopt, has, got)
			}
			if !bytes.HasPrefix(got, []byte("GET /adopted HTTP/1.1\r\n")) || !bytes.HasSuffix(got, []byte("Host: a\r\n\r\n")) {
				t.Fatalf("the request was changed beyond the inserted line:\n%q", got)
			}
		})
	}
}
