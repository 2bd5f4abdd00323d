//go:build linux

package reliability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestAgentSIGKILL kills gymtrace with SIGKILL mid-run: none of its BPF
// programs or maps stay loaded (nothing is pinned; they go with its fds), the
// traced workload never notices, and a new gymtrace traces at once.
func TestAgentSIGKILL(t *testing.T) {
	needRoot(t)
	srv := startServer(t)
	g := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := load(ctx, srv.url("/steady"), 2, 2*time.Millisecond)
	waitSpan(t, g.jsonl, 30*time.Second, "under steady load", func(s span) bool { return s.path() == "/steady" })

	progs, maps, err := bpfObjects(g.Pid())
	if err != nil {
		t.Fatal(err)
	}
	names := bpftoolProgs(t)
	var ours []string
	for id := range progs {
		ours = append(ours, fmt.Sprintf("%s(%d)", names[id], id))
	}
	sort.Strings(ours)
	if len(progs) == 0 || len(maps) == 0 {
		t.Fatalf("gymtrace holds %d programs and %d maps: cannot check they go away", len(progs), len(maps))
	}

	okBefore := res.ok.Load()
	if err := syscall.Kill(g.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-g.Done
	var left []string
	var gone time.Duration
	for {
		left = left[:0]
		now := bpftoolProgs(t)
		for id := range progs {
			if _, ok := now[id]; ok {
				left = append(left, fmt.Sprintf("%s(%d)", now[id], id))
			}
		}
		for id := range maps {
			if m, err := ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
				m.Close()
				left = append(left, fmt.Sprintf("map %d", id))
			} else if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("looking up map %d: %v", id, err)
			}
		}
		if len(left) == 0 {
			gone = time.Since(killed)
			break
		}
		// The kernel frees them in deferred work: a bound on a failure,
		// not a timing (the time taken is logged).
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("30s after SIGKILL these of gymtrace's BPF objects are still loaded: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The workload kept going through the kill.
	for deadline := time.Now().Add(30 * time.Second); res.ok.Load() <= okBefore; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the workload made no progress in the 30s after gymtrace was killed (%s)", res)
			break
		}
	}
	if res.errs.Load() != 0 || res.bad.Load() != 0 {
		t.Errorf("the workload saw failures around the SIGKILL: %s", res)
	}

	// A new gymtrace works at once.
	start := time.Now()
	g2 := startGymtrace(t, gtOpts{pids: []int{srv.Pid()}})
	path := uniquePath("restarted-agent")
	get(t, srv.url(path))
	waitSpan(t, g2.jsonl, 30*time.Second, "for "+path+" from the restarted gymtrace", func(s span) bool { return s.path() == path })
	again := time.Since(start)
	cancel()
	g2.terminate(t)
	t.Logf("SIGKILL: %d programs %v and %d maps gone %v after the kill; workload %s; restarted gymtrace attached and exported a span in %v",
		len(progs), ours, len(maps), gone.Round(time.Millisecond), res, again.Round(time.Millisecond))
}
