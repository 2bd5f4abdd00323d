//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The test binary re-executes itself as the processes gymtrace traces in the
// kernel-level tests: a raw HTTP/1.1 server, and a driver that plays client
// scenarios byte by byte. Both are plain Go on net.Conn, so every Write is
// one write(2) and every read is a read(2) of up to 64 KiB (as uvicorn and
// aiohttp read), which lets a test decide exactly how bytes cross syscalls.
const childEnv = "GYMTRACE_E2E_CHILD"

// Sizes shared by the server and the checks.
const (
	bigSize     = 1 << 20 // 1 MiB bodies
	manyChunks  = 300     // chunks in a chunked response
	sseEvents   = 20
	sseGap      = 5 * time.Millisecond
	headLength  = 5 // Content-Length a HEAD answer announces
	secretToken = "SECRET-XYZ"
)

func runChild(mode string) int {
	// The parent's death closes stdin: leave then, whatever the mode.
	switch mode {
	case "server":
		return childServer()
	case "driver":
		return childDriver()
	case "burn", "syscalls":
		return childLoad(mode)
	}
	fmt.Fprintf(os.Stderr, "unknown %s=%q\n", childEnv, mode)
	return 2
}

// --- server ----------------------------------------------------------------

func childServer() int {
	addr := os.Getenv("GYMTRACE_E2E_LISTEN")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen %s: %v\n", addr, err)
		return 1
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go serveConn(c)
	}
}

func serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}
			return
		}
		if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		n, err := io.Copy(io.Discard, req.Body)
		if err != nil {
			return
		}
		if strings.HasSuffix(req.URL.Path, "/upgrade") {
			// 101, then the connection is an echo pipe, no longer HTTP.
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			buf := make([]byte, 4096)
			for {
				m, err := br.Read(buf)
				if m > 0 {
					c.Write(buf[:m])
				}
				if err != nil {
					return
				}
			}
		}
		if !respond(c, req, n) || req.Close {
			return
		}
	}
}

func chunk(p string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(p), p) }

// respond answers by the last path segment; it returns false when the
// connection must close.
func respond(c net.Conn, req *http.Request, n int64) bool {
	path := req.URL.Path
	action := path[strings.LastIndexByte(path, '/')+1:]
	simple := func(status int, body string, extra string) bool {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n%sContent-Length: %d\r\n\r\n%s",
			status, http.StatusText(status), extra, len(body), body)
		return true
	}
	if req.Method == http.MethodHead {
		// The length of the body a GET would get, and no body.
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", headLength)
		return true
	}
	switch {
	case action == "big":
		body := bytes.Repeat([]byte("b"), bigSize)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(body))
		c.Write(body)
		return true
	case action == "chunks", action == "burst":
		var b strings.Builder
		b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
		if action == "chunks" {
			io.WriteString(c, b.String())
			b.Reset()
		}
		for i := 0; i < manyChunks; i++ {
			if action == "chunks" {
				io.WriteString(c, chunk(fmt.Sprintf("piece %04d", i)))
			} else {
				b.WriteString(chunk(fmt.Sprintf("piece %04d", i)))
			}
		}
		b.WriteString("0\r\n\r\n")
		io.WriteString(c, b.String())
		return true
	case action == "sse":
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < sseEvents; i++ {
			time.Sleep(sseGap)
			io.WriteString(c, chunk(fmt.Sprintf("data: {\"delta\": %d}\n\n", i)))
		}
		io.WriteString(c, chunk("data: [DONE]\n\n")+"0\r\n\r\n")
		return true
	case action == "nocontent":
		io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		return true
	case action == "close":
		// No framing: the body ends when the connection does.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end")
		return false
	case action == "secret":
		return simple(200, "your token is "+secretToken, "Set-Cookie: s="+secretToken+"; HttpOnly\r\n")
	case len(action) == 4 && action[0] == 's':
		code, err := strconv.Atoi(action[1:])
		if err == nil {
			return simple(code, "status "+action[1:], "")
		}
	}
	return simple(200, fmt.Sprintf("ok %d", n), "")
}

// --- driver ------------------------------------------------------------------

// childDriver runs client scenarios named on stdin ("NAME ADDR") and answers
// each with one line: "ok NAME {json}" or "err NAME message".
func childDriver() int {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		name, addr, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		sn, ok := scenarioByName(name)
		if !ok {
			fmt.Printf("err %s no such scenario\n", name)
			continue
		}
		res, err := sn.drive(addr)
		if err != nil {
			fmt.Printf("err %s %s\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		j, _ := json.Marshal(res)
		fmt.Printf("ok %s %s\n", name, j)
	}
	return 0
}

// rawClient is one TCP connection written and read by hand.
type rawClient struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
}

func dialRaw(addr string) (*rawClient, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return &rawClient{addr: addr, c: c, br: bufio.NewReaderSize(c, 64<<10)}, nil
}

func (r *rawClient) close() { r.c.Close() }

// send writes each part with its own write(2), gap apart.
func (r *rawClient) send(gap time.Duration, parts ...string) error {
	for i, p := range parts {
		if i > 0 && gap > 0 {
			time.Sleep(gap)
		}
		if _, err := io.WriteString(r.c, p); err != nil {
			return err
		}
	}
	return nil
}

type response struct {
	status  int
	bodyLen int64
	body    string
}

// read reads one response to a request of method (HEAD answers have no body).
func (r *rawClient) read(method string) (response, error) {
	resp, err := http.ReadResponse(r.br, &http.Request{Method: method})
	if err != nil {
		return response{}, fmt.Errorf("reading the answer to %s: %w", method, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	n, err := io.Copy(&b, resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("reading the body of a %d answer: %w", resp.StatusCode, err)
	}
	body := b.String()
	if len(body) > 200 {
		body = body[:200]
	}
	return response{status: resp.StatusCode, bodyLen: n, body: body}, nil
}

// roundTrip sends a whole request in one write and reads its answer.
func (r *rawClient) roundTrip(method, path string, headers []string, body string) (response, error) {
	if err := r.send(0, request(r.addr, method, path, headers, body)); err != nil {
		return response{}, err
	}
	return r.read(method)
}

func (r *rawClient) expect(method, path string, headers []string, body string, status int) error {
	resp, err := r.roundTrip(method, path, headers, body)
	if err != nil {
		return err
	}
	if resp.status != status {
		return fmt.Errorf("%s %s answered %d, want %d", method, path, resp.status, status)
	}
	return nil
}

// request is a complete HTTP/1.1 request; a Content-Length is added when
// body is not empty.
func request(host, method, path string, headers []string, body string) string {
	return requestHead(host, method, path, headers, body) + body
}

func requestHead(host, method, path string, headers []string, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, host)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	return b.String()
}

// kept holds connections a scenario leaves open for a later one (a
// connection that predates gymtrace).
var kept = struct {
	sync.Mutex
	m map[string]*rawClient
}{m: map[string]*rawClient{}}
