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

	"github.com/cilium/ebpf"

	"github.com/gymtrace/gymtrace/internal/inject/testbpf"
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

// runConnectLater (child): waits for "go", then connects to
// GYMTRACE_INJECT_ADDR, sends one request and prints its local port.
func runConnectLater() int {
	if _, err := io.ReadFull(os.Stdin, make([]byte, 3)); err != nil {
		return 1
	}
	c, err := net.Dial("tcp4", os.Getenv("GYMTRACE_INJECT_ADDR"))
	if err != nil {
		fmt.Println("err", err)
		return 1
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /later HTTP/1.1\r\nHost: a\r\n\r\n")); err != nil {
		fmt.Println("err", err)
		return 1
	}
	c.(*net.TCPConn).CloseWrite()
	fmt.Println(c.LocalAddr().(*net.TCPAddr).Port)
	return 0
}

func mapLen(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var prev any
	for {
		next, err := m.NextKeyBytes(prev)
		if err != nil {
			t.Fatal(err)
		}
		if next == nil {
			return n
		}
		n++
		prev = next
	}
}

func setMask(t *testing.T, k *kernel, mask uint64) {
	t.Helper()
	var cfg testbpf.Config
	if err := k.o.GtConfig.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Mask = mask
	if err := k.o.GtConfig.Put(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
}

// Without http_client nothing of injection runs: a target's new connection
// stays out of the sockhash and its request goes untouched; and
// ReleaseConnections (a reload that drops http_client) empties the sockhash
// of adopted ones, after which their requests go untouched too.
func TestInjectionOffWithoutHTTPClient(t *testing.T) {
	needRoot(t)
	k := loadKernel(t, true)
	rec := newRecorder(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	setMask(t, k, testbpf.GroupServer)
	c := startChild(t, "connectlater", "GYMTRACE_INJECT_ADDR="+rec.addr())
	k.addTarget(t, c.pid())
	out, err := c.run(ctx)
	port, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || perr != nil {
		t.Fatalf("child: %q %v", out, err)
	}
	if got := rec.wait(t, port); bytes.Contains(got, []byte("traceparent")) {
		t.Fatalf("http_client off, but the request was injected:\n%s", got)
	}
	if n := mapLen(t, k.o.GtInjectSocks); n != 0 {
		t.Fatalf("http_client off, but %d sockets entered the sockhash", n)
	}

	setMask(t, k, testbpf.GroupServer|testbpf.GroupHTTPClient)
	c2 := startChild(t, "preconnected", "GYMTRACE_INJECT_ADDR="+rec.addr())
	line, err := c2.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	port2, _ := strconv.Atoi(strings.TrimSpace(line))
	k.addTarget(t, c2.pid())
	if n, err := k.inj.AdoptConnections(c2.pid()); n != 1 || err != nil {
		t.Fatalf("AdoptConnections = %d, %v", n, err)
	}
	if err := k.inj.ReleaseConnections(); err != nil {
		t.Fatal(err)
	}
	if s, p := mapLen(t, k.o.GtInjectSocks), mapLen(t, k.o.GtInjectProcs); s != 0 || p != 0 {
		t.Fatalf("after ReleaseConnections: %d sockets, %d processes left", s, p)
	}
	if out, err := c2.run(ctx); err != nil || strings.TrimSpace(out) != "done" {
		t.Fatalf("child: %q %v", out, err)
	}
	if got := rec.wait(t, port2); bytes.Contains(got, []byte("traceparent")) {
		t.Fatalf("a released connection was injected:\n%s", got)
	}
}
