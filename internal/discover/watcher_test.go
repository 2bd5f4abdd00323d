package discover

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type change struct {
	add  bool
	pid  int
	name string
}

func (c change) String() string {
	op := "-"
	if c.add {
		op = "+"
	}
	return fmt.Sprintf("%s%d:%s", op, c.pid, c.name)
}

// startWatcher runs a Watcher over a fresh fake /proc and returns its changes.
func startWatcher(t *testing.T, procs []fakeProc, o WatcherOptions) (*Watcher, string, <-chan change) {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, procs)
	ch := make(chan change, 100)
	o.FS = &FS{Root: root}
	o.OnAdd = func(p *Process) { ch <- change{true, p.PID, p.ServerName} }
	o.OnRemove = func(p *Process) { ch <- change{false, p.PID, p.ServerName} }
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := NewWatcher(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, root, ch
}

func expect(t *testing.T, ch <-chan change, want ...string) {
	t.Helper()
	var got []string
	for range want {
		select {
		case c := <-ch:
			got = append(got, c.String())
		case <-time.After(30 * time.Second):
			t.Fatalf("changes = %v, want %v (timed out)", got, want)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("changes = %v, want %v", got, want)
	}
}

func expectNone(t *testing.T, ch <-chan change) {
	t.Helper()
	select {
	case c := <-ch:
		t.Fatalf("unexpected change %v", c)
	case <-time.After(100 * time.Millisecond):
	}
}

func agent(pid int, name string) fakeProc {
	return fakeProc{pid: pid, ppid: 1, comm: "python", argv: []string{"python", "app.py"}, env: gymEnv(name), exe: "/usr/bin/python3"}
}

func TestWatcherFollowsEvents(t *testing.T) {
	w, root, ch := startWatcher(t, []fakeProc{agent(10, "simple_agent"), {pid: 11, ppid: 1, comm: "bash", argv: []string{"bash"}}},
		WatcherOptions{Discover: true, Interval: -1})
	expect(t, ch, "+10:simple_agent")

	// A server started after gymtrace: found on its exec event.
	agent(20, "weather").write(t, root)
	w.OnExec(20)
	expect(t, ch, "+20:weather")
	// A non-Gym exec is ignored.
	fakeProc{pid: 21, ppid: 1, comm: "ls", argv: []string{"ls"}}.write(t, root)
	w.OnExec(21)
	expectNone(t, ch)

	// A thread exiting while its process lives on changes nothing.
	w.OnExit(20)
	expectNone(t, ch)

	// The process exits (zombie first, then reaped).
	must(t, os.RemoveAll(filepath.Join(root, "20")))
	p := agent(20, "weather")
	p.state = 'Z'
	p.write(t, root)
	w.OnExit(20)
	expect(t, ch, "-20:weather")

	// Exec of a tracked PID into something that is not Gym drops it.
	must(t, os.RemoveAll(filepath.Join(root, "10")))
	fakeProc{pid: 10, ppid: 1, comm: "sleep", start: 1010, argv: []string{"sleep", "9"}}.write(t, root)
	w.OnExec(10)
	expect(t, ch, "-10:simple_agent")
	if n := len(w.Targets()); n != 0 {
		t.Errorf("targets left: %d", n)
	}
}

func TestWatcherPIDReuse(t *testing.T) {
	w, root, ch := startWatcher(t, []fakeProc{agent(30, "simple_agent")}, WatcherOptions{Discover: true, Interval: -1})
	expect(t, ch, "+30:simple_agent")
	// The process exits unseen and its PID is reused by another Gym server.
	must(t, os.RemoveAll(filepath.Join(root, "30")))
	p := agent(30, "policy_model")
	p.start = 99999
	p.write(t, root)
	w.Rescan()
	expect(t, ch, "-30:simple_agent", "+30:policy_model")
	if got := w.Targets(); len(got) != 1 || got[0].StartTime != 99999 {
		t.Errorf("targets = %+v", got)
	}
}

func TestWatcherPeriodicRescan(t *testing.T) {
	_, root, ch := startWatcher(t, nil, WatcherOptions{Discover: true, Interval: 20 * time.Millisecond})
	agent(40, "weather").write(t, root)
	expect(t, ch, "+40:weather")
	must(t, os.RemoveAll(filepath.Join(root, "40")))
	expect(t, ch, "-40:weather")
}

func TestWatcherExplicitPIDs(t *testing.T) {
	procs := []fakeProc{agent(50, "simple_agent"), {pid: 51, ppid: 1, comm: "node", argv: []string{"node", "srv.js"}}}
	// --pid alone: the named process, Gym or not, and nothing else.
	w, root, ch := startWatcher(t, procs, WatcherOptions{PIDs: []int{51}, Interval: -1})
	expect(t, ch, "+51:")
	agent(52, "weather").write(t, root)
	w.OnExec(52)
	expectNone(t, ch)
	must(t, os.RemoveAll(filepath.Join(root, "51")))
	w.OnExit(51)
	expect(t, ch, "-51:")

	// --pid with discovery.
	_, _, ch = startWatcher(t, procs, WatcherOptions{PIDs: []int{51}, Discover: true, Interval: -1})
	expect(t, ch, "+50:simple_agent", "+51:")

	root = t.TempDir()
	writeTree(t, root, procs)
	_, err := NewWatcher(WatcherOptions{FS: &FS{Root: root}, PIDs: []int{51, 4242}})
	if err == nil || !strings.Contains(err.Error(), "process 4242 does not exist") {
		t.Errorf("missing --pid: err = %v", err)
	}
	if _, err := NewWatcher(WatcherOptions{FS: &FS{Root: root}}); err == nil {
		t.Error("a watcher with nothing to trace should be an error")
	}
}

func TestWatcherQueueOverflowRescans(t *testing.T) {
	root := t.TempDir()
	ch := make(chan change, 10)
	w, err := NewWatcher(WatcherOptions{FS: &FS{Root: root}, Discover: true, Interval: -1,
		OnAdd:  func(p *Process) { ch <- change{true, p.PID, p.ServerName} },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Events queued before Run; more than the queue holds, none naming 60.
	for i := 0; i < 5000; i++ {
		w.OnExit(100000 + i)
	}
	agent(60, "weather").write(t, root)
	if !w.overflow.Load() {
		t.Fatal("a full queue did not ask for a rescan")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	expect(t, ch, "+60:weather")
}
