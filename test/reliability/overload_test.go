//go:build linux

package reliability

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// wrkResult is what wrk printed.
type wrkResult struct {
	requests     int
	non2xx       int
	socketErrors int
	raw          string
}

var (
	wrkRequests = regexp.MustCompile(`(\d+) requests in`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkSockErrs = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

func runWrk(t *testing.T, url string, threads, conns int, d time.Duration) wrkResult {
	t.Helper()
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Skip("needs wrk (apt-get install wrk) to load the server beyond the ring buffer's capacity")
	}
	out, err := exec.Command(wrk, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%ds", int(d.Seconds())), url).CombinedOutput()
	if err != nil {
		t.Fatalf("wrk: %v\n%s", err, out)
	}
	r := wrkResult{raw: string(out)}
	m := wrkRequests.FindStringSubmatch(r.raw)
	if m == nil {
		t.Fatalf("wrk printed no request count:\n%s", out)
	}
	r.requests, _ = strconv.Atoi(m[1])
	if m := wrkNon2xx.FindStringSubmatch(r.raw); m != nil {
		r.non2xx, _ = strconv.Atoi(m[1])
	}
	if m := wrkSockErrs.FindStringSubmatch(r.raw); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.Atoi(s)
			r.socketErrors += n
		}
	}
	return r
}

// TestOverloadBurst drives a traced server far beyond what a one-page ring
// buffer holds: the kernel counts what it could not reserve, gymtrace stays
// up with bounded memory, the workload sees no error, and capture resumes.
func TestOverloadBurst(t *testing.T) {
	needRoot(t)
	const ringBytes = 4096
	srv := startServer(t)
	// The reader lags until the ring overflows (GYMTRACE_TEST_LAGGING_READER):
	// a reader that kept up with the burst would leave the loss path
	// untested.
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}, extra: []string{"--ringbuf-bytes", strconv.Itoa(ringBytes)},
		env: []string{"GYMTRACE_TEST_LAGGING_READER=1"}})

	// Before the burst: one request, one span, nothing lost.
	before := uniquePath("before")
	get(t, srv.url(before))
	waitSpan(t, g.jsonl, 30*time.Second, "for "+before, func(s span) bool { return s.path() == before })
	rssBefore := memKiB(t, g.Pid(), "VmRSS")

	d := pick(5*time.Second, 60*time.Second)
	w := runWrk(t, srv.url("/burst"), 2, 32, d)
	if g.Exited() {
		t.Fatalf("gymtrace died under the burst (%v); stderr:\n%s", g.Err, tail(g.Stderr.String(), 4096))
	}
	if w.non2xx != 0 || w.socketErrors != 0 {
		t.Errorf("the traced workload saw errors under the burst: %d non-2xx, %d socket errors\n%s", w.non2xx, w.socketErrors, w.raw)
	}

	// Each request is two records (a request record and a response head);
	// the ring holds ringBytes/(both) exchanges.
	capacity := 2 * ringBytes / (loader.HTTPEventSize + loader.HTTPEventHeadSize + 16)
	records := 2 * w.requests
	if records < 10*capacity {
		t.Fatalf("the burst was only %d records for a %d-record ring buffer; wanted at least 10x", records, capacity)
	}
	m := g.metrics(t)
	fails := m["gymtrace_ringbuf_reserve_failures_total"]
	emitted := m[`gymtrace_events_emitted_total{group="server"}`]
	if fails <= 0 {
		t.Errorf("gymtrace_ringbuf_reserve_failures_total is %v after %d records into a %d-record ring buffer: losses are not counted",
			fails, records, capacity)
	}

	// Capture resumes: a request after the burst gives its span.
	time.Sleep(500 * time.Millisecond)
	after := uniquePath("after")
	start := time.Now()
	get(t, srv.url(after))
	waitSpan(t, g.jsonl, 30*time.Second, "for "+after+" (capture did not resume after the burst)",
		func(s span) bool { return s.path() == after })
	resumed := time.Since(start)

	hwm := memKiB(t, g.Pid(), "VmHWM")
	rss := memKiB(t, g.Pid(), "VmRSS")
	const limitKiB = 256 << 10
	if hwm > limitKiB {
		t.Errorf("gymtrace's peak RSS (VmHWM) reached %d KiB under the burst; bound is %d KiB", hwm, limitKiB)
	}
	exported := len(readSpans(t, g.jsonl))
	g.terminate(t)
	t.Logf("burst %v: %d requests (%.0f/s), %d records vs %d-record ring (%.0fx); kernel emitted %.0f, reserve failures %.0f (%.1f%% lost); %d spans exported; wrk errors %d non-2xx, %d socket",
		d, w.requests, float64(w.requests)/d.Seconds(), records, capacity, float64(records)/float64(capacity),
		emitted, fails, 100*fails/(emitted+fails), exported, w.non2xx, w.socketErrors)
	t.Logf("gymtrace memory: RSS %d KiB before, %d KiB after, peak (VmHWM) %d KiB; span after the burst exported in %v",
		rssBefore, rss, hwm, resumed.Round(time.Millisecond))
}
