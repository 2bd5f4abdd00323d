//go:build linux

package inject

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/inject/testbpf"
)

// One syscall of the traced client: write(2) for one buffer, writev(2) for
// several, or sendto(2)/sendmsg(2).
type writePlan struct {
	Mode string   `json:"mode"` // write, writev, sendto, sendmsg
	Bufs [][]byte `json:"bufs"`
}

type connPlan struct {
	TLS    bool        `json:"tls"`
	Writes []writePlan `json:"writes"`
}

type scenario struct {
	Addr    string     `json:"addr"`
	TLSAddr string     `json:"tls_addr"`
	Conns   []connPlan `json:"conns"`
}

// reqInfo locates one request in a connection's intended byte stream.
type reqInfo struct {
	start, lineEnd int
	expect         bool // exactly one header must be inserted after its request line
	what           string
}

type connCase struct {
	plan connPlan
	want []byte // every byte the client means to send
	reqs []reqInfo
}

// gen builds fuzzed request shapes. expect follows the documented rules
// (docs/injection.md): a request gets the header when its whole head is in
// the first buffer of a syscall that starts at a message boundary the parser
// knows, and it carries no traceparent.
type gen struct {
	r *mrand.Rand
}

func (g *gen) token(n int) string {
	const a = "abcdefghijklmnopqrstuvwxyz0123456789-_"
	b := make([]byte, n)
	for i := range b {
		b[i] = a[g.r.IntN(len(a))]
	}
	return string(b)
}

func (g *gen) body(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		// Bodies that look like HTTP must not fool anything.
		if g.r.IntN(50) == 0 {
			copy(b[i:], "GET / HTTP/1.1\r\ntraceparent: x\r\n\r\n")
		} else if b[i] == 0 {
			b[i] = byte(g.r.IntN(256))
		}
	}
	return b
}

type req struct {
	head    []byte
	body    [][]byte // body framing units: CL body pieces, or whole chunks
	lineEnd int
	hasTP   bool
}

func (g *gen) request(hdrBytes int, tp string, chunked bool, bodyLen int) req {
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
	m := methods[g.r.IntN(len(methods))]
	if bodyLen > 0 && (m == "GET" || m == "DELETE" || m == "OPTIONS") {
		m = "POST"
	}
	var h strings.Builder
	fmt.Fprintf(&h, "%s /%s/%s?q=%s HTTP/1.1\r\n", m, g.token(1+g.r.IntN(20)), g.token(1+g.r.IntN(30)), g.token(5))
	lineEnd := h.Len()
	fmt.Fprintf(&h, "Host: 127.0.0.1:%d\r\n", 1000+g.r.IntN(60000))
	hdrs := []string{"User-Agent: gt-test/" + g.token(4), "Accept: */*", "X-Req: " + g.token(8)}
	if tp != "" {
		hdrs = append(hdrs, tp)
	}
	for h.Len()+len(strings.Join(hdrs, "\r\n")) < hdrBytes {
		hdrs = append(hdrs, "X-Pad-"+g.token(4)+": "+g.token(10+g.r.IntN(200)))
	}
	g.r.Shuffle(len(hdrs), func(i, j int) { hdrs[i], hdrs[j] = hdrs[j], hdrs[i] })
	var body [][]byte
	if chunked {
		hdrs = append(hdrs, "Transfer-Encoding: chunked")
		// At most 6 chunks: the kernel parser follows a bounded number of
		// chunks per syscall buffer (bpf/http.h), and past that it loses the
		// message boundary; then nothing is injected until it resyncs.
		left := bodyLen
		for k := 0; left > 0; k++ {
			n := 1 + g.r.IntN(left)
			if k == 5 {
				n = left
			}
			left -= n
			body = append(body, append(append([]byte(strconv.FormatInt(int64(n), 16)+"\r\n"), g.body(n)...), '\r', '\n'))
		}
		body = append(body, []byte("0\r\n\r\n"))
	} else if bodyLen > 0 || m == "POST" {
		hdrs = append(hdrs, "Content-Length: "+strconv.Itoa(bodyLen))
		if bodyLen > 0 {
			body = append(body, g.body(bodyLen))
		}
	}
	h.WriteString(strings.Join(hdrs, "\r\n"))
	h.WriteString("\r\n\r\n")
	return req{head: []byte(h.String()), body: body, lineEnd: lineEnd, hasTP: tp != ""}
}

// headCut picks where to split a head across syscalls or iovecs: after the
// request line, but not inside a Content-Length or Transfer-Encoding line
// nor between a CR and its LF. The kernel parser reads framing headers only
// from lines whole in one buffer, so a cut there makes it lose the message
// boundary (bpf/http.h), and nothing is injected until it resyncs.
func (g *gen) headCut(r req) int {
	lower := bytes.ToLower(r.head)
	var avoid [][2]int
	for _, name := range []string{"\r\ncontent-length:", "\r\ntransfer-encoding:"} {
		if i := bytes.Index(lower, []byte(name)); i >= 0 {
			end := i + 2 + bytes.Index(lower[i+2:], []byte("\r\n")) + 2
			avoid = append(avoid, [2]int{i + 2, end})
		}
	}
	for {
		cut := r.lineEnd + 1 + g.r.IntN(len(r.head)-r.lineEnd-2)
		ok := r.head[cut-1] != '\r'
		for _, a := range avoid {
			if cut > a[0] && cut <= a[1] {
				ok = false
			}
		}
		if ok {
			return cut
		}
	}
}

// split cuts b into pieces at random points.
func (g *gen) split(b []byte, pieces int) [][]byte {
	if pieces <= 1 || len(b) < 2 {
		return [][]byte{b}
	}
	cuts := map[int]bool{}
	for len(cuts) < pieces-1 && len(cuts) < len(b)-1 {
		cuts[1+g.r.IntN(len(b)-1)] = true
	}
	var idx []int
	for c := range cuts {
		idx = append(idx, c)
	}
	sort.Ints(idx)
	var out [][]byte
	prev := 0
	for _, c := range idx {
		out = append(out, b[prev:c])
		prev = c
	}
	return append(out, b[prev:])
}

func (g *gen) mode(n int) string {
	if n > 1 {
		if g.r.IntN(2) == 0 {
			return "writev"
		}
		return "sendmsg"
	}
	return []string{"write", "sendto", "sendmsg", "writev"}[g.r.IntN(4)]
}

const tpLine = "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// conn builds one connection: a keep-alive sequence of request shapes.
func (g *gen) conn(n int) connCase {
	var c connCase
	idle := true // the parser is idle at a boundary it knows
	add := func(w writePlan) {
		c.plan.Writes = append(c.plan.Writes, w)
		for _, b := range w.Bufs {
			c.want = append(c.want, b...)
		}
	}
	addReq := func(r req, expect bool, what string) {
		c.reqs = append(c.reqs, reqInfo{start: len(c.want), lineEnd: len(c.want) + r.lineEnd, expect: expect, what: what})
	}
	for i := 0; i < n; i++ {
		tp := ""
		switch g.r.IntN(8) {
		case 0:
			tp = tpLine
		case 1:
			tp = "Traceparent: not-a-valid-value"
		}
		chunked := g.r.IntN(4) == 0
		bodyLen := []int{0, 0, 10, 300, 2000, 70000}[g.r.IntN(6)]
		hdr := []int{100, 600, 2500, 3800}[g.r.IntN(4)]
		r := g.request(hdr, tp, chunked, bodyLen)
		for len(r.head) > 3800 {
			// Heads near the kernel's 4 KiB scan are their own case below
			// (the parser's own window is a little smaller).
			r = g.request(hdr-500, tp, chunked, bodyLen)
		}
		ok := idle && !r.hasTP
		shape := g.r.IntN(7)
		switch shape {
		case 0, 1: // the whole request in one syscall (maybe several buffers, head whole in the first)
			addReq(r, ok, "whole")
			bufs := [][]byte{r.head}
			for _, b := range r.body {
				bufs = append(bufs, b)
			}
			if len(bufs) > 1 && g.r.IntN(2) == 0 {
				flat := bytes.Join(bufs, nil)
				bufs = [][]byte{flat}
			}
			if len(bufs) > 4 { // the parser reads the first 4 iovecs of a syscall
				bufs = [][]byte{bytes.Join(bufs, nil)}
			}
			add(writePlan{Mode: g.mode(len(bufs)), Bufs: bufs})
		case 2: // head, then the body in pieces
			addReq(r, ok, "head+body pieces")
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{r.head}})
			for _, unit := range r.body {
				if chunked {
					add(writePlan{Mode: g.mode(1), Bufs: [][]byte{unit}}) // chunk-size lines stay whole
					continue
				}
				for _, p := range g.split(unit, 1+g.r.IntN(4)) {
					add(writePlan{Mode: g.mode(1), Bufs: [][]byte{p}})
				}
			}
		case 3: // head split across syscalls inside the header block: not whole, no header
			addReq(r, false, "split head")
			cut := g.headCut(r)
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{r.head[:cut]}})
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{r.head[cut:]}})
			for _, unit := range r.body {
				add(writePlan{Mode: g.mode(1), Bufs: [][]byte{unit}})
			}
		case 4: // request line split across syscalls
			addReq(r, false, "split request line")
			cut := 4 + g.r.IntN(r.lineEnd-5)
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{r.head[:cut]}})
			rest := append(append([]byte{}, r.head[cut:]...), bytes.Join(r.body, nil)...)
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{rest}})
		case 5: // pipelined: two Content-Length requests in one buffer; only the first can get one
			if chunked {
				r = g.request(min(hdr, 3000), tp, false, 100)
				ok = idle && !r.hasTP
			}
			r2 := g.request(300, "", false, []int{0, 50}[g.r.IntN(2)])
			addReq(r, ok, "pipelined first")
			b := append(append([]byte{}, r.head...), bytes.Join(r.body, nil)...)
			c.reqs = append(c.reqs, reqInfo{start: len(c.want) + len(b), lineEnd: len(c.want) + len(b) + r2.lineEnd, what: "pipelined second"})
			b = append(append(b, r2.head...), bytes.Join(r2.body, nil)...)
			add(writePlan{Mode: g.mode(1), Bufs: [][]byte{b}})
		case 6: // writev whose first buffer holds part of the head only
			addReq(r, false, "head split across iovecs")
			cut := g.headCut(r)
			bufs := [][]byte{r.head[:cut], r.head[cut:]}
			bufs = append(bufs, r.body...)
			if len(bufs) > 4 {
				bufs = [][]byte{bufs[0], bytes.Join(bufs[1:], nil)}
			}
			add(writePlan{Mode: []string{"writev", "sendmsg"}[g.r.IntN(2)], Bufs: bufs})
		}
		idle = true
	}
	// Non-HTTP bytes, then a request: the parser is not at a boundary it
	// knows when that request starts, so it gets nothing; the next one does.
	if g.r.IntN(3) == 0 {
		add(writePlan{Mode: "write", Bufs: [][]byte{[]byte("\x16\x03\x01 not http at all\r\n\r\n")}})
		r := g.request(200, "", false, 0)
		addReq(r, false, "after non-HTTP bytes")
		add(writePlan{Mode: "write", Bufs: [][]byte{r.head}})
		r = g.request(200, "", false, 0)
		addReq(r, true, "after resync")
		add(writePlan{Mode: "write", Bufs: [][]byte{r.head}})
	}
	// A head larger than the kernel scans: no header (kept last: the parser
	// loses framing on it).
	if g.r.IntN(4) == 0 {
		r := g.request(6000, "", false, 0)
		addReq(r, false, "head over 4 KiB")
		add(writePlan{Mode: "write", Bufs: [][]byte{r.head}})
	}
	return c
}

var injectedRE = regexp.MustCompile(`^traceparent: 00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]\r\n`)

// check compares what the server received with what the client meant to
// send. It returns the inserted traceparent values, one per request (""
// when none), or a description of the first difference.
func check(c connCase, got []byte) ([]string, error) {
	vals := make([]string, len(c.reqs))
	oi, gi := 0, 0
	same := func(to int) error {
		n := to - oi
		if gi+n > len(got) || !bytes.Equal(c.want[oi:to], got[gi:gi+n]) {
			k := 0
			for k < n && gi+k < len(got) && c.want[oi+k] == got[gi+k] {
				k++
			}
			return fmt.Errorf("byte %d of the intended stream differs (received %d bytes, intended %d): want %q, got %q",
				oi+k, len(got), len(c.want), snippet(c.want, oi+k), snippet(got, gi+k))
		}
		oi, gi = to, gi+n
		return nil
	}
	for i, r := range c.reqs {
		if err := same(r.lineEnd); err != nil {
			return nil, fmt.Errorf("before/in request %d (%s): %w", i, r.what, err)
		}
		if m := injectedRE.Find(got[gi:]); m != nil && !bytes.HasPrefix(c.want[oi:], m) {
			vals[i] = string(m[len("traceparent: ") : len(m)-2])
			gi += len(m)
		}
	}
	if err := same(len(c.want)); err != nil {
		return nil, fmt.Errorf("after the last request: %w", err)
	}
	if gi != len(got) {
		return nil, fmt.Errorf("%d extra bytes received: %q", len(got)-gi, snippet(got, gi))
	}
	return vals, nil
}

func snippet(b []byte, at int) string {
	if at >= len(b) {
		return "<end>"
	}
	return string(b[at:min(len(b), at+40)])
}

// TestByteExact: a traced Go client sends fuzzed request shapes over plain
// TCP and TLS; the server receives every intended byte plus exactly one
// header line where the rules say, and the kernel's request records name
// exactly the values that went on the wire.
func TestByteExact(t *testing.T) {
	needRoot(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GYMTRACE_INJECT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (GYMTRACE_INJECT_SEED=%d reproduces)", seed, seed)
	g := &gen{r: mrand.New(mrand.NewPCG(seed, 7))}

	k := loadKernel(t, true)
	srv := newRecorder(t, false)
	tsrv := newRecorder(t, true)

	nconn := 40
	if testing.Short() {
		nconn = 10
	}
	var cases []connCase
	sc := scenario{Addr: srv.addr(), TLSAddr: tsrv.addr()}
	for i := 0; i < nconn; i++ {
		c := g.conn(1 + g.r.IntN(8))
		cases = append(cases, c)
		sc.Conns = append(sc.Conns, c.plan)
	}
	// TLS: the same shapes inside TLS get nothing (the socket carries
	// ciphertext), and arrive intact.
	for i := 0; i < 3; i++ {
		c := g.conn(3)
		c.plan.TLS = true
		for j := range c.reqs {
			c.reqs[j].expect = false
		}
		cases = append(cases, c)
		sc.Conns = append(sc.Conns, c.plan)
	}
	if only := os.Getenv("GYMTRACE_INJECT_ONLY"); only != "" {
		// Debugging: rerun one connection of a seed.
		i, _ := strconv.Atoi(only)
		cases, sc.Conns = cases[i:i+1], sc.Conns[i:i+1]
	}
	f, err := os.CreateTemp(t.TempDir(), "scenario-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewEncoder(f).Encode(sc); err != nil {
		t.Fatal(err)
	}
	f.Close()

	ch := startChild(t, "client", "GYMTRACE_INJECT_SCENARIO="+f.Name())
	k.addTarget(t, ch.pid())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line, err := ch.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Ports []int  `json:"ports"`
		Err   string `json:"err"`
	}
	if err := json.Unmarshal([]byte(line), &rep); err != nil || rep.Err != "" {
		t.Fatalf("client report %q: %v %s", line, err, rep.Err)
	}

	var wantInjected, gotInjected []string
	inserted := 0
	for i, c := range cases {
		rec := srv
		if c.plan.TLS {
			rec = tsrv
		}
		got := rec.wait(t, rep.Ports[i])
		vals, err := check(c, got)
		if err != nil {
			t.Errorf("connection %d (%d writes, tls=%v): %v", i, len(c.plan.Writes), c.plan.TLS, err)
			continue
		}
		for j, r := range c.reqs {
			if (vals[j] != "") != r.expect {
				t.Errorf("connection %d request %d (%s): inserted=%q, want inserted=%v\n%s", i, j, r.what, vals[j], r.expect, describe(c, vals))
			}
			if vals[j] != "" {
				inserted++
				wantInjected = append(wantInjected, vals[j])
			}
		}
	}
	// The kernel reports exactly the values it put on the wire.
	deadline := time.Now().Add(3 * time.Second)
	for {
		gotInjected = gotInjected[:0]
		for _, e := range k.requests(ch.pid()) {
			if e.Flags&testbpf.FlagInjected != 0 {
				gotInjected = append(gotInjected, string(e.Traceparent[:55]))
			}
		}
		if len(gotInjected) >= len(wantInjected) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	sort.Strings(wantInjected)
	sort.Strings(gotInjected)
	if strings.Join(wantInjected, ",") != strings.Join(gotInjected, ",") {
		t.Errorf("request records with GT_F_INJECTED (%d of %d records) do not match the headers on the wire (%d)",
			len(gotInjected), len(k.requests(ch.pid())), len(wantInjected))
	}
	st := k.stats(t)
	t.Logf("%d connections, %d requests, %d headers inserted; kernel: %s", len(cases), countReqs(cases), inserted, fmtStats(st))
	if st[inject.StatPushFail] != 0 {
		t.Errorf("push_fail = %d: the sk_msg program refused a prepared insertion", st[inject.StatPushFail])
	}
}

func countReqs(cs []connCase) int {
	n := 0
	for _, c := range cs {
		n += len(c.reqs)
	}
	return n
}

func fmtStats(st []uint64) string {
	var parts []string
	for i, name := range inject.StatNames {
		if st[i] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, st[i]))
		}
	}
	return strings.Join(parts, " ")
}

// recorder is a TCP (or TLS) server that keeps every byte each connection
// sent, keyed by the client's port.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	cond *sync.Cond
	data map[int][]byte
}

func newRecorder(t testing.TB, useTLS bool) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if useTLS {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	}
	r := &recorder{ln: ln, data: map[int][]byte{}}
	r.cond = sync.NewCond(&r.mu)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				port := c.RemoteAddr().(*net.TCPAddr).Port
				r.mu.Lock()
				r.data[port] = b
				r.cond.Broadcast()
				r.mu.Unlock()
			}()
		}
	}()
	return r
}

func (r *recorder) addr() string { return r.ln.Addr().String() }

func (r *recorder) wait(t testing.TB, port int) []byte {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, func() { r.mu.Lock(); r.cond.Broadcast(); r.mu.Unlock() })
	defer timer.Stop()
	start := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if b, ok := r.data[port]; ok {
			return b
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the server never saw the connection from port %d end", port)
		}
		r.cond.Wait()
	}
}

func selfSigned(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

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

// describe lists a connection's requests and syscalls for a failure message.
func describe(c connCase, vals []string) string {
	var b strings.Builder
	for j, r := range c.reqs {
		line := c.want[r.start:r.lineEnd]
		fmt.Fprintf(&b, "  request %d at %d: %s expect=%v inserted=%v %q\n", j, r.start, r.what, r.expect, vals[j] != "", line[:min(len(line), 30)])
	}
	off := 0
	for _, w := range c.plan.Writes {
		var sizes []string
		for _, x := range w.Bufs {
			sizes = append(sizes, strconv.Itoa(len(x)))
		}
		fmt.Fprintf(&b, "  %s at %d: [%s] %q\n", w.Mode, off, strings.Join(sizes, " "), snippet(w.Bufs[0], 0))
		for _, x := range w.Bufs {
			off += len(x)
		}
	}
	return b.String()
}
