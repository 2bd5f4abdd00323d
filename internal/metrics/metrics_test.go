package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/export"
)

func fullSources(exported *atomic.Uint64) Sources {
	return Sources{
		EventsEmitted:          func() map[string]uint64 { return map[string]uint64{"server": 12, "http_client": 7} },
		EventsDiscarded:        func() map[string]uint64 { return map[string]uint64{"verify": 3} },
		RingbufReserveFailures: func() uint64 { return 2 },
		KernelCounters:         func() map[string]uint64 { return map[string]uint64{"not_http": 5, "resync": 1} },
		PythonContext:          func() map[string]uint64 { return map[string]uint64{"rooted_read": 7} },
		SpansBuilt:             func() map[string]uint64 { return map[string]uint64{"server": 6} },
		Joins:                  func() map[string]uint64 { return map[string]uint64{"stream": 8} },
		ParentUnresolved:       func() map[string]uint64 { return map[string]uint64{"ambiguous": 4} },
		Export: func() ExportStats {
			return ExportStats(export.Stats{Exported: exported.Load(), Failed: 1, Dropped: 9, QueueLen: 3, QueueCap: 8192})
		},
		TargetsAttached: func() int { return 3 },
	}
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}

func TestMetricsEndpointServesEverySeries(t *testing.T) {
	var exported atomic.Uint64
	exported.Store(10)
	m := New(fullSources(&exported))
	h := m.Handler()

	code, body := get(t, h, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`gymtrace_events_emitted_total{group="server"} 12`,
		`gymtrace_events_emitted_total{group="http_client"} 7`,
		`gymtrace_events_discarded_total{group="verify"} 3`,
		`gymtrace_ringbuf_reserve_failures_total 2`,
		`gymtrace_kernel_events_total{reason="not_http"} 5`,
		`gymtrace_kernel_events_total{reason="resync"} 1`,
		`gymtrace_python_context_total{event="rooted_read"} 7`,
		`gymtrace_spans_built_total{group="server"} 6`,
		`gymtrace_server_joins_total{how="stream"} 8`,
		`gymtrace_parent_unresolved_total{reason="ambiguous"} 4`,
		`gymtrace_spans_exported_total 10`,
		`gymtrace_spans_export_failed_total 1`,
		`gymtrace_spans_dropped_total 9`,
		`gymtrace_export_queue_length 3`,
		`gymtrace_export_queue_capacity 8192`,
		`gymtrace_targets_attached 3`,
		`gymtrace_ready 0`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if strings.HasPrefix(want, "gymtrace_") && !strings.Contains("\n"+body, "\n"+want+"\n") ||
			!strings.Contains(body, want) {
			t.Errorf("/metrics lacks the line %q", want)
		}
	}

	// Values are read at scrape time.
	exported.Store(25)
	if _, body = get(t, h, "/metrics"); !strings.Contains(body, "gymtrace_spans_exported_total 25") {
		t.Error("exported count not re-read at scrape")
	}
	// Every gymtrace series passes the registry's consistency checks.
	if mfs, err := m.Registry().Gather(); err != nil || len(mfs) == 0 {
		t.Fatalf("gather: %d families, %v", len(mfs), err)
	}
}

func TestMetricsWithoutSourcesAndUpdate(t *testing.T) {
	m := New(Sources{})
	_, body := get(t, m.Handler(), "/metrics")
	if strings.Contains(body, "gymtrace_spans_exported_total") {
		t.Error("exported series without a source")
	}
	if !strings.Contains(body, "gymtrace_ready 0") {
		t.Error("no gymtrace_ready")
	}
	m.Update(func(s *Sources) { s.TargetsAttached = func() int { return 7 } })
	if _, body = get(t, m.Handler(), "/metrics"); !strings.Contains(body, "gymtrace_targets_attached 7") {
		t.Error("Update not seen")
	}
}

func TestHealthzOnlyOnceReady(t *testing.T) {
	m := New(Sources{})
	h := m.Handler()
	if code, body := get(t, h, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
		t.Fatalf("before SetReady: %d %q", code, body)
	}
	m.SetReady()
	if code, _ := get(t, h, "/healthz"); code != 200 {
		t.Fatalf("after SetReady: %d", code)
	}
	if _, body := get(t, h, "/metrics"); !strings.Contains(body, "gymtrace_ready 1") {
		t.Error("gymtrace_ready not 1")
	}
	m.SetNotReady()
	if code, _ := get(t, h, "/healthz"); code != http.StatusServiceUnavailable {
		t.Fatalf("after SetNotReady: %d", code)
	}
}

func TestServerStartAndShutdown(t *testing.T) {
	m := New(Sources{TargetsAttached: func() int { return 1 }})
	s, err := m.Start("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "gymtrace_targets_attached 1") {
		t.Fatalf("scrape over TCP:\n%s", b)
	}
	// A second server on the same port is a readable error.
	if _, err := m.Start(s.Addr().String(), nil); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("port in use: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("server still answering after Shutdown")
	}
}
