//go:build linux

package inject

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/inject"
	"github.com/gymtrace/gymtrace/internal/preflight"
)

// TestThroughput measures what injection costs a traced client: keep-alive
// HTTP/1.1 POSTs (64-byte bodies) from a traced Go client to an untraced
// server, with the kernel parser on, injection off and on, interleaved so
// drift on a shared machine hits all three alike. GYMTRACE_INJECT_BENCH=1
// runs longer. It fails only if injection costs more than half the rate.
func TestThroughput(t *testing.T) {
	needRoot(t)
	rounds, dur := 3, time.Second
	if os.Getenv("GYMTRACE_INJECT_BENCH") == "1" {
		rounds, dur = 7, 3*time.Second
	}
	k := loadKernel(t, false)
	k.discard.Store(true)
	srv := newBenchServer(t)
	cg, err := preflight.CgroupV2Path()
	if err != nil {
		t.Skip(err)
	}

	measure := func(target, withInject bool) float64 {
		t.Helper()
		if withInject {
			inj, err := inject.Attach(programs(k.o), inject.Options{CgroupPath: cg, SampleRatio: 1})
			if err != nil {
				t.Fatalf("attaching injection: %v", err)
			}
			k.inj = inj
			defer func() { inj.Close(); k.inj = nil }()
		}
		ch := startChild(t, "bench", "GYMTRACE_INJECT_ADDR="+srv.addr(), "GYMTRACE_INJECT_DUR="+dur.String())
		if target {
			k.addTarget(t, ch.pid())
		}
		ctx, cancel := context.WithTimeout(context.Background(), dur+20*time.Second)
		defer cancel()
		line, err := ch.run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			RPS float64 `json:"rps"`
			Err string  `json:"err"`
		}
		if err := json.Unmarshal([]byte(line), &rep); err != nil || rep.Err != "" {
			t.Fatalf("bench client: %q %v", line, err)
		}
		return rep.RPS
	}
	// Per-program cost of the injection side (bpf_stats).
	if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer st.Close()
		defer func() {
			for name, p := range map[string]*ebpf.Program{
				"sys_enter_write": k.o.GtInjectEnterWrite, "sk_msg": k.o.GtInjectMsg,
				"sock_ops": k.o.GtInjectSockops, "sys_exit_write (parser)": k.o.GtExitWrite,
			} {
				ps, err := p.Stats()
				if err != nil || ps.RunCount == 0 {
					continue
				}
				t.Logf("  %-24s %8d runs  %6.0f ns/run", name, ps.RunCount, float64(ps.Runtime.Nanoseconds())/float64(ps.RunCount))
			}
		}()
	}
	var base, off, on []float64
	injected0 := srv.injected.Load()
	for r := 0; r < rounds; r++ {
		base = append(base, measure(false, false))
		off = append(off, measure(true, false))
		on = append(on, measure(true, true))
	}
	mb, mf, mo := median(base), median(off), median(on)
	t.Logf("requests/s, median of %d interleaved %v runs (2 cores, client 4 connections):", rounds, dur)
	t.Logf("  untraced %.0f  %v", mb, round(base))
	t.Logf("  traced, injection off %.0f  %v  (%.3f of untraced)", mf, round(off), mf/mb)
	t.Logf("  traced, injection on  %.0f  %v  (%.3f of injection off)", mo, round(on), mo/mf)
	if srv.injected.Load() == injected0 {
		t.Errorf("the server saw no traceparent while injection was on")
	}
	if mo < 0.5*mf {
		t.Errorf("injection on runs at %.2f of injection off", mo/mf)
	}
}

func median(v []float64) float64 {
	s := append([]float64{}, v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func round(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

const benchResp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// benchServer answers every request with a 2-byte body; it counts the
// requests that arrived with a traceparent.
type benchServer struct {
	ln       net.Listener
	injected atomic.Uint64
}

func newBenchServer(t testing.TB) *benchServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &benchServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *benchServer) addr() string { return s.ln.Addr().String() }

func (s *benchServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 16<<10)
	resp := []byte(benchResp)
	for {
		cl := 0
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				break
			}
			if bytes.HasPrefix(line, []byte("traceparent:")) {
				s.injected.Add(1)
			}
			if v, ok := bytes.CutPrefix(bytes.ToLower(line), []byte("content-length:")); ok {
				cl, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if _, err := r.Discard(cl); err != nil {
			return
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// runBenchClient (GYMTRACE_INJECT_CHILD=bench): 4 keep-alive connections
// POSTing for GYMTRACE_INJECT_DUR; prints {"rps": N}.
func runBenchClient() int {
	addr := os.Getenv("GYMTRACE_INJECT_ADDR")
	dur, err := time.ParseDuration(os.Getenv("GYMTRACE_INJECT_DUR"))
	if err != nil {
		fmt.Printf("{\"err\": %q}\n", err.Error())
		return 1
	}
	if _, err := io.ReadFull(os.Stdin, make([]byte, 3)); err != nil {
		return 1
	}
	req := []byte("POST /v1/responses HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: gt-bench\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n" +
		`{"model":"m","input":"hello hello hello hello hello hello hello"}`)
	var n atomic.Uint64
	var firstErr atomic.Value
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			buf := make([]byte, 64)
			for time.Now().Before(stop) {
				if _, err := c.Write(req); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				if _, err := io.ReadFull(r, buf[:len(benchResp)]); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	rep := map[string]any{"rps": float64(n.Load()) / dur.Seconds()}
	if e := firstErr.Load(); e != nil {
		rep["err"] = e
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	return 0
}
