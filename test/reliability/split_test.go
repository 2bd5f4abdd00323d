//go:build linux

package reliability

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestRequestSplitInsideMethod: a request whose first read(2) returns only
// part of the method ("G", then "ET /x HTTP/1.1...") is still one request.
// Go's net/http server makes this common under keep-alive load: after each
// request it starts a 1-byte background read to notice a closed connection,
// which takes the first byte of the next request. Found under TestSlowCollector's
// load, where about 1% of requests left no span and counted parse_error.
func TestRequestSplitInsideMethod(t *testing.T) {
	needRoot(t)
	srv := startServer(t)
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}})

	c, err := net.DialTimeout("tcp", srv.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	br := bufio.NewReader(c)
	var paths []string
	for i := range 3 {
		path := uniquePath(fmt.Sprintf("split-%d", i))
		paths = append(paths, path)
		req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, srv.addr)
		for _, part := range []string{req[:1], req[1:]} {
			if _, err := io.WriteString(c, part); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(2 * time.Second)
	var missing []string
	got := map[string]bool{}
	for _, s := range readSpans(t, g.jsonl) {
		got[s.path()] = true
	}
	for _, p := range paths {
		if !got[p] {
			missing = append(missing, p)
		}
	}
	m := g.metrics(t)
	if len(missing) > 0 {
		t.Errorf("%d of %d requests whose first read held only \"G\" left no span (kernel counters: not_http %v, parse_error %v): %v",
			len(missing), len(paths), m[`gymtrace_kernel_events_total{reason="not_http"}`], m[`gymtrace_kernel_events_total{reason="parse_error"}`], missing)
	}
	g.terminate(t)
}
