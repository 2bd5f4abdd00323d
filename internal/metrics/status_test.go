package metrics

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/test/testproc"
)

func TestRender(t *testing.T) {
	prev := Snapshot{Targets: 3, Spans: map[string]uint64{"server": 100, "http_client": 200, "verify": 10, "zzz": 0}}
	cur := Snapshot{Targets: 3, Spans: map[string]uint64{"server": 220, "http_client": 440, "verify": 15, "zzz": 0}, Drops: 4}
	got := Render(prev, cur, 2*time.Second, 0)
	want := "targets 3 | spans/s server 60 http_client 120 verify 2.5 zzz 0 | drops 4"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if got := Render(Snapshot{}, Snapshot{Targets: 1}, time.Second, 0); got != "targets 1 | spans/s - | drops 0" {
		t.Fatalf("empty: %q", got)
	}
	if got := Render(prev, cur, 2*time.Second, 30); len([]rune(got)) != 29 || !strings.HasSuffix(got, "…") {
		t.Fatalf("cut to 30 columns: %q (%d)", got, len([]rune(got)))
	}
	// A counter that went backwards (a restart) shows 0, not a huge rate.
	if got := Render(cur, prev, time.Second, 0); !strings.Contains(got, "server 0 ") {
		t.Fatalf("backwards: %q", got)
	}
}

func TestRenderGymMetrics(t *testing.T) {
	prev := Snapshot{Targets: 4, Gym: GymSummary{Rollouts: 100}}
	cur := Snapshot{Targets: 4, Gym: GymSummary{Rollouts: 130, RolloutP50: 850 * time.Millisecond,
		RolloutP99: 2250 * time.Millisecond, VerifyOK: 199, VerifyAll: 200}}
	got := Render(prev, cur, 10*time.Second, 0)
	want := "targets 4 | spans/s - | rollouts/s 3.0 p50 850ms p99 2.25s | verify ok 99.5% | drops 0"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

type lockedBuf = testproc.Buffer

func TestStatusLineOnATerminal(t *testing.T) {
	out := &lockedBuf{}
	n := uint64(0)
	var mu sync.Mutex
	s := &StatusLine{out: out, active: true, fd: ^uintptr(0), snapshot: func() Snapshot {
		mu.Lock()
		defer mu.Unlock()
		n += 10
		return Snapshot{Targets: 2, Spans: map[string]uint64{"server": n}}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, 20*time.Millisecond); close(done) }()
	deadline := time.Now().Add(30 * time.Second) // a bound on a failure, not a timing
	for !strings.Contains(out.String(), "targets 2 | spans/s server") {
		if time.Now().After(deadline) {
			t.Fatalf("no status line drawn: %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Write([]byte("trace abc rollout 1-0\n"))
	cancel()
	<-done
	o := out.String()
	// The tree line is written on a cleared line and the status redrawn after.
	i := strings.Index(o, "trace abc rollout 1-0\n")
	if i < 0 || !strings.HasSuffix(o[:i], "\r\x1b[K") || !strings.Contains(o[i:], "targets 2") {
		t.Fatalf("write not framed by erase and redraw: %q", o)
	}
	if !strings.HasSuffix(o, "\r\x1b[K") {
		t.Fatalf("status line not erased at the end: %q", o)
	}
}

func TestStatusLineOffATerminalPassesThrough(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Fatal("a regular file is a terminal")
	}
	s := NewStatusLine(f, func() Snapshot { return Snapshot{} })
	if s.Active() {
		t.Fatal("active on a file")
	}
	// Off a terminal Run returns at once: it must not wait for its context,
	// which here would take an hour (the bound below turns that into a
	// failure; it is not a timing).
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	ran := make(chan struct{})
	go func() { s.Run(ctx, 10*time.Millisecond); close(ran) }()
	select {
	case <-ran:
	case <-time.After(30 * time.Second):
		t.Fatal("Run waited off a terminal")
	}
	s.Write([]byte("hello\n"))
	b, _ := os.ReadFile(f.Name())
	if string(b) != "hello\n" {
		t.Fatalf("file got %q", b)
	}
}
