//go:build linux

package loader

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
)

// TestParserCost measures the kernel's CPU per traced HTTP message with
// bpf_stats (run_time_ns / messages) on a keep-alive connection inside the
// test process. It reports; it asserts only that records arrived.
// Run: sudo go test -run ParserCost -v ./internal/loader
func TestParserCost(t *testing.T) {
	if os.Getenv("GYMTRACE_COST") == "" {
		t.Skip("set GYMTRACE_COST=1 to measure the parser's cost (needs root)")
	}
	needRoot(t)
	if err := os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("1"), 0); err != nil {
		t.Skip("cannot enable bpf_stats: ", err)
	}
	r := newRig(t, allGroups)
	const n = 3000
	req := "POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.8.4\r\nCookie: a=b\r\nContent-Type: application/json\r\nContent-Length: 120\r\n\r\n" + strings.Repeat("x", 120)
	resp := "HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 16:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 200\r\ncontent-type: application/json\r\n\r\n" + strings.Repeat("y", 200)
	addr := server(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for i := 0; i < n; i++ {
			if _, err := readRequest(br); err != nil {
				return
			}
			c.Write([]byte(resp))
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := progTimes(t, r.tr)
	buf := make([]byte, len(resp))
	// GYMTRACE_COST_THRASH=MiB: walk that much memory between exchanges, as
	// an interpreter between its syscalls does, so the programs run with
	// cold caches as they do under a Python server.
	var thrash []byte
	if v := os.Getenv("GYMTRACE_COST_THRASH"); v != "" {
		var mib int
		fmt.Sscan(v, &mib)
		thrash = make([]byte, mib<<20)
	}
	var sink byte
	for i := 0; i < n; i++ {
		for j := 0; j < len(thrash); j += 64 {
			thrash[j]++
			sink += thrash[j]
		}
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	after := progTimes(t, r.tr)
	_ = sink
	got := r.waitFor(n, kindSide(EvResponse, SideClient))
	if len(got) < n*9/10 && os.Getenv("GYMTRACE_PROF_SKIP") == "" {
		t.Fatalf("only %d of %d responses recorded", len(got), n)
	}
	var total uint64
	for name, a := range after {
		d := a.ns - before[name].ns
		cnt := a.cnt - before[name].cnt
		if cnt > 0 {
			t.Logf("%-20s runs %7d  %6.0f ns/run", name, cnt, float64(d)/float64(cnt))
		}
		total += d
	}
	for _, sec := range r.tr.ProfTable() {
		t.Logf("section %-16s runs %7d  %6.0f ns/run", sec.Name, sec.Count, sec.NsPer)
	}
	// Each exchange is four traced messages: the request written and read,
	// the response written and read.
	fmt.Printf("eBPF time per traced HTTP message: %.0f ns (%d exchanges, both ends in one process)\n", float64(total)/float64(4*n), n)
}

type progTime struct{ ns, cnt uint64 }

func progTimes(t *testing.T, tr *Tracer) map[string]progTime {
	out := map[string]progTime{}
	for name, p := range tr.Programs() {
		st, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		out[name] = progTime{uint64(st.Runtime), st.RunCount}
	}
	return out
}
