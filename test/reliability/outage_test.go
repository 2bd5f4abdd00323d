//go:build linux

package reliability

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sink struct {
	*proc
	endpoint string
	out      string
}

func startSink(t *testing.T, args ...string) *sink {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sink.jsonl")
	p := startProc(t, "otlpsink", append([]string{sinkBin, "--out", out, "-v"}, args...))
	line := p.WaitOutput(t, false, "listening ", 10*time.Second)
	return &sink{proc: p, endpoint: "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening ")), out: out}
}

// logTime is the time= of the first sink log line holding msg.
func (s *sink) logTime(msg string) (time.Time, bool) {
	for _, line := range strings.Split(s.Stderr.String(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time=")); err == nil {
			return ts, true
		}
	}
	return time.Time{}, false
}

// TestCollectorOutage takes the OTLP collector down (UNAVAILABLE) under
// load, then brings it back: gymtrace does not crash, its export queue stays
// within its capacity, what does not fit is counted as dropped, and export
// resumes after the outage.
func TestCollectorOutage(t *testing.T) {
	needRoot(t)
	outage := pick(10*time.Second, 60*time.Second)
	sk := startSink(t, "--fail-for", outage.String())
	srv := startServer(t)
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}, otlp: sk.endpoint})

	// Enough load to overflow the 8192-span queue well within the outage.
	ctx, cancel := context.WithCancel(context.Background())
	res := load(ctx, srv.url("/during"), 4, 0)
	defer cancel()

	var outageStart time.Time
	deadline := time.Now().Add(outage + 30*time.Second)
	maxQueue, queueCap := 0.0, 0.0
	for {
		time.Sleep(500 * time.Millisecond)
		if g.Exited() {
			t.Fatalf("gymtrace died during the collector outage (%v); stderr:\n%s", g.Err, tail(g.Stderr.String(), 4096))
		}
		m := g.metrics(t)
		maxQueue = max(maxQueue, m["gymtrace_export_queue_length"])
		queueCap = m["gymtrace_export_queue_capacity"]
		if outageStart.IsZero() {
			outageStart, _ = sk.logTime("export rejected")
		}
		if !outageStart.IsZero() && time.Now().After(outageStart.Add(outage)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sink saw no export within %v", deadline)
		}
	}
	cancel()
	mid := g.metrics(t)
	dropped := mid["gymtrace_spans_dropped_total"]
	failed := mid["gymtrace_spans_export_failed_total"]
	// The queue plus the call being sent or retried, which takes up to
	// MaxBatchSize spans out of it (export.PipelineConfig: 4 x the 512-span
	// batch), so the queue refills behind it.
	const maxBatch = 4 * 512
	if queueCap <= 0 || maxQueue > queueCap+maxBatch {
		t.Errorf("export queue reached %v with capacity %v: not bounded", maxQueue, queueCap)
	}
	if dropped+failed <= 0 {
		t.Errorf("%s of traffic during a %v outage, yet gymtrace_spans_dropped_total and gymtrace_spans_export_failed_total are 0: losses not counted",
			res, outage)
	}

	// Export resumes: the queue drains (it was full of spans from the outage,
	// and new ones are dropped while it is), then a new request's span
	// reaches the collector.
	drainDeadline := time.Now().Add(30 * time.Second)
	for {
		m := g.metrics(t)
		if m["gymtrace_spans_exported_total"] > 0 && m["gymtrace_export_queue_length"] < queueCap/2 {
			break
		}
		if time.Now().After(drainDeadline) {
			t.Fatalf("the export queue did not drain within 30s of the collector's recovery: %v queued, %v exported",
				m["gymtrace_export_queue_length"], m["gymtrace_spans_exported_total"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	after := uniquePath("after-outage")
	get(t, srv.url(after))
	waitSpan(t, sk.out, 30*time.Second, "for "+after+" after the outage", func(s span) bool { return s.path() == after })
	firstOK, _ := sk.logTime("export received")
	end := g.metrics(t)
	if end["gymtrace_spans_exported_total"] <= 0 {
		t.Errorf("gymtrace_spans_exported_total is 0 after the collector recovered")
	}
	if end["gymtrace_ringbuf_reserve_failures_total"] != 0 {
		t.Logf("note: %v ring-buffer reservations failed under this load (the collector outage is not their cause)", end["gymtrace_ringbuf_reserve_failures_total"])
	}
	hwm := memKiB(t, g.Pid(), "VmHWM")
	g.terminate(t)
	recovery := "unknown"
	if !firstOK.IsZero() {
		recovery = firstOK.Sub(outageStart.Add(outage)).Round(time.Millisecond).String()
	}
	t.Logf("outage %v under load (%s): queue max %.0f of %.0f, dropped %.0f, failed %.0f, exported %.0f; first export accepted %s after the collector came back; peak RSS %d KiB",
		outage, res, maxQueue, queueCap, dropped, failed, end["gymtrace_spans_exported_total"], recovery, hwm)
}

// TestSlowCollector answers every export after a long delay: the ring-buffer
// reader must keep up regardless, so at a modest rate nothing is lost in the
// kernel and every request is turned into a span at once, while export lags.
func TestSlowCollector(t *testing.T) {
	needRoot(t)
	sk := startSink(t, "--delay", "3s")
	srv := startServer(t)
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}, otlp: sk.endpoint})

	d := pick(6*time.Second, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	res := load(ctx, srv.url("/slow"), 2, 5*time.Millisecond)
	<-ctx.Done()
	cancel()
	time.Sleep(300 * time.Millisecond)
	sent := res.ok.Load()
	if res.errs.Load() != 0 || res.bad.Load() != 0 {
		t.Errorf("workload saw failures: %s", res)
	}

	m := g.metrics(t)
	if f := m["gymtrace_ringbuf_reserve_failures_total"]; f != 0 {
		t.Errorf("%v ring-buffer reservations failed at %d requests/s with a slow collector: the reader was blocked",
			f, int(float64(sent)/d.Seconds()))
	}
	// Every record the kernel emitted was read and built into a span, at
	// once, while the exporter is stuck behind the collector. (Requests vs
	// spans is not compared here: see TestRequestSplitAcrossReads.)
	emitted := m[`gymtrace_events_emitted_total{group="server"}`]
	built := m[`gymtrace_spans_built_total{group="server"}`]
	for wait := time.Now().Add(30 * time.Second); built < emitted && time.Now().Before(wait); {
		time.Sleep(200 * time.Millisecond)
		m = g.metrics(t)
		emitted = m[`gymtrace_events_emitted_total{group="server"}`]
		built = m[`gymtrace_spans_built_total{group="server"}`]
	}
	if emitted < 0.9*float64(sent) {
		t.Errorf("%d requests but the kernel emitted only %.0f exchanges", sent, emitted)
	}
	if built < emitted {
		t.Errorf("the kernel emitted %.0f exchanges but only %.0f spans were built while the collector is slow: the reader fell behind", emitted, built)
	}
	exported := m["gymtrace_spans_exported_total"]
	if exported >= built {
		t.Logf("note: export kept up (%v of %v) despite the 3s delay", exported, built)
	}
	g.terminate(t)
	t.Logf("slow collector (3s per export), %v at %.0f req/s: %d requests, %.0f spans built, %.0f exported before shutdown, %.0f ring-buffer failures",
		d, float64(sent)/d.Seconds(), sent, built, exported, m["gymtrace_ringbuf_reserve_failures_total"])
}
