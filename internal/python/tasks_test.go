package python

import (
	"errors"
	"testing"

	"github.com/gymtrace/gymtrace/internal/probesite"
	"github.com/gymtrace/gymtrace/test/testproc"
)

// TestTaskLayoutDebian reads the running task's and a Task's context's
// offsets from Debian sid's _asyncio (CPython 3.14), and finds its one copy
// stored as a Task's context among its two (the other is
// Future.add_done_callback's). 3.13 has no AsyncioDebug section.
func TestTaskLayoutDebian(t *testing.T) {
	t.Run("3.14", func(t *testing.T) {
		f := testproc.OpenELF(t, sidRoot+"/usr/lib/python3.14/lib-dynload/_asyncio.cpython-314-x86_64-linux-gnu.so")
		l, err := readTaskLayout(f)
		if err != nil {
			t.Fatal(err)
		}
		// TaskObj: 12 pointers of FutureObj_HEAD, state, flags, then the
		// task's own fields; task_context at 144 on LP64. The thread
		// state's field sits after PyThreadState's public part.
		if l.TaskContext != 144 || l.RunningTask < 200 || l.RunningTask > 4096 {
			t.Fatalf("layout %+v, want task_context 144 and a running task a few hundred bytes in", l)
		}
		c, err := probesite.FindCalls(f, ProbeSymbol)
		if err != nil {
			t.Fatal(err)
		}
		ts := taskSites(c, l)
		if len(c.Sites) != 2 || len(ts.Sites) != 1 {
			t.Fatalf("%d of %d sites stored as a Task's context, want 1 of 2 (%+v)", len(ts.Sites), len(c.Sites), c.Sites)
		}
	})
	t.Run("3.13", func(t *testing.T) {
		f := testproc.OpenELF(t, trixieRoot+"/usr/lib/python3.13/lib-dynload/_asyncio.cpython-313-x86_64-linux-gnu.so")
		if _, err := readTaskLayout(f); !errors.Is(err, ErrNoTaskLayout) {
			t.Fatalf("got %v, want ErrNoTaskLayout", err)
		}
	})
}

// TestKernelTaskLinks runs ctx_sender.py on Gym's runtime (sid: CPython
// 3.14, uvloop) with the task-only link probes and FlagTasks, then with the
// return probe on every copy. With task-only links every send made in a
// task, or in asyncio.to_thread's worker, carries its request's root as
// before, a send from a call_soon callback (a handle's context, born
// unseen) carries none and no generation (never another request's), and
// fewer copies are linked.
func TestKernelTaskLinks(t *testing.T) {
	if !SiteProbesWanted() {
		t.Skip("task-only links use call-site probes: x86-64 only (or GYMTRACE_PY_SITES=0)")
	}
	linked := map[senderProbes]uint64{}
	for _, mode := range []senderProbes{taskLinks, retLinks} {
		name := map[senderProbes]string{taskLinks: "tasks", retLinks: "every_copy"}[mode]
		t.Run(name, func(t *testing.T) {
			objs := loadTestObjects(t)
			attachTP(t, "sys_enter_sendto", objs.PytestSendto)
			attachTP(t, "sys_enter_recvfrom", objs.PytestRecvEnter)
			attachTP(t, "sys_exit_recvfrom", objs.PytestRecvExit)
			events, in := runSender(t, "sid", objs, mode, "uvloop")
			kinds, requests := checkSends(t, events, mode == taskLinks)
			t.Logf("CPython %s on uvloop, %s: %d sends checked: %v", in.Version, name, len(events), kinds)
			for _, k := range []string{"explicit", "request", "task", "gather", "nested", "eager", "soon", "thread"} {
				if kinds[k] == 0 {
					t.Errorf("no %q sends seen", k)
				}
			}
			if requests != 8 {
				t.Errorf("%d requests have roots, want 8", requests)
			}
			logStats(t, objs.GtPyStats)
			linked[mode] = statSum(t, objs, StatLinked)
			if n := statSum(t, objs, StatNotTask); mode == taskLinks && n == 0 {
				t.Error("no link was distrusted, yet call_soon callbacks sent")
			}
		})
	}
	// 8 requests of 7 tasks each at least; the return probe also links
	// every uvloop handle and done callback.
	if tl, rl := linked[taskLinks], linked[retLinks]; tl > 0 && rl > 0 && (tl < 8*7 || tl >= rl) {
		t.Errorf("task-only links: %d copies linked, every copy: %d; want at least 56 and fewer", tl, rl)
	}
}
