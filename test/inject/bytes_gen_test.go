//go:build linux

package inject

import (
	"bytes"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"strconv"
	"strings"
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
