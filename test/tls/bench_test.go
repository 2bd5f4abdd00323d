//go:build linux

package tls

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBenchHTTPSThroughput measures HTTPS request throughput of an aiohttp
// client (one keep-alive connection, sequential small POSTs, the worst case
// for relative overhead) traced by gymtrace against an identical client that
// is not traced, in interleaved rounds. A measurement for docs/tls.md, not a
// check:
//
//	sudo GYMTRACE_TLS_BENCH=1 go test ./test/tls/ -run Bench -v -count=1
func TestBenchHTTPSThroughput(t *testing.T) {
	if os.Getenv("GYMTRACE_TLS_BENCH") == "" {
		t.Skip("a measurement: set GYMTRACE_TLS_BENCH=1 (root) to run it")
	}
	needEnv(t)
	u := startUpstream(t)
	url := fmt.Sprintf("https://127.0.0.1:%d/v1/json", u.port)
	if os.Getenv("GYMTRACE_TLS_BENCH_PLAIN") != "" {
		// The same load over plain HTTP: what the syscall path costs, for
		// comparison.
		url = fmt.Sprintf("http://127.0.0.1:%d/v1/json", startPlainUpstream(t))
	}
	go func() { // the upstream records Authorization values; nobody reads them here
		for range u.auth {
		}
	}()
	traced := start(t, python, "testdata/bench_client.py", url, u.ca)
	plain := start(t, python, "testdata/bench_client.py", url, u.ca)
	for _, p := range []*proc{traced, plain} {
		if l := p.line(t); l != "ready" {
			t.Fatalf("bench client said %q", l)
		}
	}
	// GYMTRACE_TLS_BENCH_GROUPS=server measures the probes with client
	// records gated off (no userspace work); job,rollout with no probe.
	groups := os.Getenv("GYMTRACE_TLS_BENCH_GROUPS")
	if groups == "" {
		groups = "default"
	}
	firstProg := maxProgID()
	g := startGymtrace(t, groups, strconv.Itoa(traced.cmd.Process.Pid)+"=model")
	time.Sleep(time.Second)

	const n, rounds = 1000, 7
	run := func(p *proc) float64 {
		fmt.Fprintln(p.stdin, n)
		v, err := strconv.ParseFloat(p.line(t), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	calls0 := g.kernelCounter(t, "tls_calls")
	events0 := g.kernelCounter(t, "tls_events")
	var tr, pl []float64
	for r := 0; r < rounds; r++ {
		if r%2 == 0 {
			tr = append(tr, run(traced))
			pl = append(pl, run(plain))
		} else {
			pl = append(pl, run(plain))
			tr = append(tr, run(traced))
		}
	}
	calls := g.kernelCounter(t, "tls_calls") - calls0
	events := g.kernelCounter(t, "tls_events") - events0
	logProgStats(t, firstProg)
	g.stop(t)
	mt, mp := median(tr), median(pl)
	t.Logf("span groups %s", groups)
	t.Logf("untraced %.0f req/s, traced %.0f req/s (medians of %d rounds of %d): ratio %.3f, %.1f µs added per request",
		mp, mt, rounds, n, mt/mp, (1/mt-1/mp)*1e6)
	t.Logf("per request: %.1f TLS probe runs (entry and return count separately), %.2f records", calls/(rounds*n), events/(rounds*n))
	t.Logf("traced rounds   %v", tr)
	t.Logf("untraced rounds %v", pl)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

type progStat struct {
	ID        int     `json:"id"`
	Name      string  `json:"name"`
	RunTimeNs float64 `json:"run_time_ns"`
	RunCnt    float64 `json:"run_cnt"`
}

// progStats lists the loaded BPF programs with their run statistics
// (nil without bpftool).
func progStats() []progStat {
	out, err := exec.Command("bpftool", "-j", "prog", "show").Output()
	if err != nil {
		return nil
	}
	var ps []progStat
	_ = json.Unmarshal(out, &ps)
	return ps
}

func maxProgID() int {
	m := 0
	for _, p := range progStats() {
		m = max(m, p.ID)
	}
	return m
}

// logProgStats logs the run time of gymtrace's programs (loaded after
// program id after), when the kernel keeps BPF statistics (sysctl
// kernel.bpf_stats_enabled=1) and bpftool is installed.
func logProgStats(t *testing.T, after int) {
	if b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err != nil || strings.TrimSpace(string(b)) != "1" {
		return
	}
	for _, p := range progStats() {
		if p.ID > after && strings.HasPrefix(p.Name, "gt_") && p.RunCnt > 0 {
			t.Logf("%-20s %10.0f runs %8.0f ns/run", p.Name, p.RunCnt, p.RunTimeNs/p.RunCnt)
		}
	}
}
