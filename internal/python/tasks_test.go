package python

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"golang.org/x/arch/x86/x86asm"

	"github.com/gymtrace/gymtrace/internal/probesite"
	pytestbpf "github.com/gymtrace/gymtrace/internal/python/pytest_bpf"
	"github.com/gymtrace/gymtrace/test/testproc"
)

// TestTaskLayoutDebian reads the running task's and a Task's context's
// offsets from Debian sid's _asyncio (CPython 3.14), and from
// python-build-standalone's 3.14 interpreter, which has it built in, and
// finds its one copy stored as a Task's context among its two (the other
// is Future.add_done_callback's). 3.13 has no AsyncioDebug section.
func TestTaskLayoutDebian(t *testing.T) {
	t.Run("3.14", func(t *testing.T) {
		f, l, c, ts := taskLayoutSites(t, sidRoot+"/usr/lib/python3.14/lib-dynload/_asyncio.cpython-314-x86_64-linux-gnu.so")
		if len(c.Sites) != 2 || len(ts.Sites) != 1 {
			t.Fatalf("%d of %d sites stored as a Task's context, want 1 of 2 (%+v)", len(ts.Sites), len(c.Sites), c.Sites)
		}
		// Past eager starts: the inlined register_task after
		// task_call_step_soon, the Task in %r15 (mov %rsi,0x98(%r15)).
		// task_eager_start's own registration is in another function.
		lazy, err := lazySite(f, ts.Sites[0], l)
		if err != nil {
			t.Fatal(err)
		}
		if !lazy.Holder || lazy.Reg != x86asm.R15 || lazy.Probe != lazy.Call || lazy.Call <= ts.Sites[0].Call {
			t.Fatalf("lazy Task site %+v (the copy at %#x), want a call after the copy, the Task in R15", lazy, ts.Sites[0].Call)
		}
	})
	// python-build-standalone's 3.14 has _asyncio built into the
	// executable, and clang (LTO) reads the thread state inline: the probe
	// past eager starts goes on the jcc of register_task's
	// `if (task_node.next == NULL)`, the Task in %rbx (mov %rdx,0x98(%rbx)).
	t.Run("pbs3.14", func(t *testing.T) {
		f, l, c, ts := taskLayoutSites(t, sidRoot+pbsPython)
		if len(c.Sites) != 2 || len(ts.Sites) != 1 || len(c.Returns) != 1 {
			t.Fatalf("%d of %d sites stored as a Task's context, %d wrappers; want 1 of 2, 1 (%+v)", len(ts.Sites), len(c.Sites), len(c.Returns), c)
		}
		lazy, err := lazySite(f, ts.Sites[0], l)
		if err != nil {
			t.Fatal(err)
		}
		code, err := probesite.ReadVaddr(f, lazy.Probe, 2)
		if err != nil || !lazy.Holder || lazy.Reg != x86asm.RBX || lazy.Probe != lazy.Call || len(code) < 1 || code[0] < 0x70 || code[0] > 0x7f {
			t.Fatalf("lazy Task site %+v (bytes % x, err %v), want a jcc, the Task in RBX", lazy, code, err)
		}
	})
	t.Run("3.13", func(t *testing.T) {
		f := testproc.OpenELF(t, trixieRoot+"/usr/lib/python3.13/lib-dynload/_asyncio.cpython-313-x86_64-linux-gnu.so")
		if _, err := readTaskLayout(f); !errors.Is(err, ErrNoTaskLayout) {
			t.Fatalf("got %v, want ErrNoTaskLayout", err)
		}
	})
}

// taskLayoutSites reads the task layout of the ELF at path (a 3.14 _asyncio,
// or an interpreter with it built in) and its copy sites, all of them and
// those stored as a Task's context.
func taskLayoutSites(t *testing.T, path string) (*elf.File, TaskLayout, *probesite.Calls, *probesite.Calls) {
	t.Helper()
	f := testproc.OpenELF(t, path)
	l, err := readTaskLayout(f)
	if err != nil {
		t.Fatal(err)
	}
	// TaskObj: 12 pointers of FutureObj_HEAD, state, flags, then the
	// task's own fields; task_context at 144 on LP64. The thread state's
	// field sits after PyThreadState's public part.
	if l.TaskContext != 144 || l.RunningTask < 200 || l.RunningTask > 4096 {
		t.Fatalf("layout %+v, want task_context 144 and a running task a few hundred bytes in", l)
	}
	c, err := probesite.FindCalls(f, ProbeSymbol)
	if err != nil {
		t.Fatal(err)
	}
	return f, l, c, taskSites(c, l)
}

// TestKernelTaskLinks runs ctx_sender.py on Gym's runtime (sid: CPython
// 3.14, uvloop) with the task-only link probes and FlagTasks, on lazily
// started Tasks only (FlagEager) and on every Task birth, then with the
// return probe on every copy. With task-only links every send made in a
// task, or in asyncio.to_thread's worker, carries its request's root as
// before, a send from a call_soon callback (a handle's context, born
// unseen) carries none and no generation (never another request's), and
// fewer copies are linked. With FlagEager the eager tasks' links are made
// in their eager steps, and fewer births are probed than with every Task's.
func TestKernelTaskLinks(t *testing.T) {
	if !SiteProbesWanted() {
		t.Skip("task-only links use call-site probes: x86-64 only (or GYMTRACE_PY_SITES=0)")
	}
	for _, which := range taskInterps {
		t.Run(which, func(t *testing.T) { kernelTaskLinks(t, which) })
	}
}

// taskInterps: Debian sid's CPython 3.14 (GCC) and python-build-standalone's
// (clang, LTO, BOLT, _asyncio built into the executable) in the same root,
// with the same uvloop.
var taskInterps = []string{"sid", "pbs"}

func kernelTaskLinks(t *testing.T, which string) {
	linked := map[senderProbes]uint64{}
	// Births seen by the call-site probes: exactly the script's Task
	// births each mode probes (linked also counts the return probes'
	// copies, whose number varies with the executor's thread count).
	atSites := map[senderProbes]uint64{}
	for _, mode := range []senderProbes{lazyTaskLinks, taskLinks, retLinks} {
		name := map[senderProbes]string{lazyTaskLinks: "lazy_tasks", taskLinks: "tasks", retLinks: "every_copy"}[mode]
		t.Run(name, func(t *testing.T) {
			objs := loadTestObjects(t)
			attachTP(t, "sys_enter_sendto", objs.PytestSendto)
			attachTP(t, "sys_enter_recvfrom", objs.PytestRecvEnter)
			attachTP(t, "sys_exit_recvfrom", objs.PytestRecvExit)
			events, in := runSender(t, which, objs, mode, "uvloop")
			kinds, requests := checkSends(t, events, mode)
			t.Logf("CPython %s on uvloop, %s: %d sends checked: %v", in.Version, name, len(events), kinds)
			for _, k := range []string{"explicit", "request", "task", "gather", "nested", "eager", "eager_later",
				"eager_quiet", "eager_chain", "soon", "thread"} {
				if kinds[k] == 0 {
					t.Errorf("no %q sends seen", k)
				}
			}
			if requests != 8 {
				t.Errorf("%d requests have roots, want 8", requests)
			}
			logStats(t, objs.GtPyStats)
			linked[mode] = statSum(t, objs, StatLinked)
			atSites[mode] = statSum(t, objs, StatLinkedSite)
			if n := statSum(t, objs, StatNotTask); mode != retLinks && n == 0 {
				t.Error("no link was distrusted, yet call_soon callbacks sent")
			}
			// eager_child: its eager step sends, so its link is made there.
			if n := statSum(t, objs, StatEager); mode == lazyTaskLinks && n < 8 {
				t.Errorf("%d links made in eager steps, want at least 8 (one for each request's eager_child)", n)
			} else if mode != lazyTaskLinks && n != 0 {
				t.Errorf("%d links made in eager steps without FlagEager", n)
			}
		})
	}
	// 8 requests of 7 tasks each at least; the return probe also links
	// every uvloop handle and done callback.
	if tl, rl := linked[taskLinks], linked[retLinks]; tl > 0 && rl > 0 && (tl < 8*7 || tl >= rl) {
		t.Errorf("task-only links: %d copies linked, every copy: %d; want at least 56 and fewer", tl, rl)
	}
	// Each request starts 4 eager tasks, which only taskLinks probes;
	// lazyTaskLinks also sees the 9 Tasks given a context (the 8 explicit
	// ones, the main task), whose context taskLinks sees copied nowhere.
	if el, tl := atSites[lazyTaskLinks], atSites[taskLinks]; el > 0 && tl > 0 && el+8*4 != tl+9 {
		t.Errorf("lazily started tasks only: %d births probed, every Task: %d; want 23 fewer (32 eager, 9 given)", el, tl)
	}
}

// TestKernelEagerSerial: the owner check tells a new Task at a dead one's
// address apart by its name counter, and a link with no owner is no running
// Task's. eager_stale.py starts three eager tasks that make no traced call
// in their eager steps; in each eager step the test
// plants at the task's context the link a dead Task at the same Task and
// context addresses would have left (the 0.7 % case of docs/python-causality.md,
// "Eager tasks"), with a root of its own. A's planted link has another
// serial: its later send must carry no root. B's has none recorded (a named
// Task's): the address check alone passes it, and its send carries that
// root, which shows the planted link is what the kernel reads. C's has no
// owner (what the return probe left before the call-site probes went on, or
// a copy_context() context that died): its send must carry no root.
func TestKernelEagerSerial(t *testing.T) {
	if !SiteProbesWanted() {
		t.Skip("task-only links use call-site probes: x86-64 only (or GYMTRACE_PY_SITES=0)")
	}
	for _, which := range taskInterps {
		t.Run(which, func(t *testing.T) { kernelEagerSerial(t, which) })
	}
}

func kernelEagerSerial(t *testing.T, which string) {
	objs := loadTestObjects(t)
	attachTP(t, "sys_enter_sendto", objs.PytestSendto)
	var hello struct {
		PID int `json:"pid"`
	}
	s := startJSON(t, pyCmd(t, which, testdataScript(t, "eager_stale.py")), &hello)
	in, err := InspectInterpreter(hello.PID)
	if err != nil {
		t.Fatal(err)
	}
	c, l, _, err := in.AttachTaskProbes(objs.GtPyCopySite, objs.GtPyCopyRet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if !l.Eager {
		t.Fatalf("the probe could not move past eager starts: %v", l.EagerErr)
	}
	params := in.Params
	l.Apply(&params)
	if params.LongType == 0 {
		t.Fatal("PyLong_Type not found in the interpreter's .dynsym")
	}
	key := uint32(in.PID)
	if err := objs.GtPyProcs.Put(key, params); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.GtPyProcs.Delete(key) })
	rd, err := ringbuf.NewReader(objs.PytestEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	fmt.Fprintln(s.stdin, "go")
	roots := map[string]CtxID{"A": 0x7f00_0000_a000 | 3<<genShift, "B": 0x7f00_0000_b000 | 3<<genShift,
		"C": 0x7f00_0000_c000 | 3<<genShift}
	for _, name := range []string{"A", "B", "C"} {
		var born struct{ Task, Ctx uint64 }
		line, err := s.out.ReadBytes('\n')
		if err != nil || json.Unmarshal(line, &born) != nil || born.Task == 0 || born.Ctx == 0 {
			t.Fatalf("task %s: no ids from its eager step (%q): %v", name, line, err)
		}
		planted := Link{Root: roots[name], Gen: 9, BornNs: 1, Owner: born.Task}
		switch name {
		case "A":
			planted.OwnerSerial = 1<<63 | 0xdead // no counter's
		case "C":
			// What a probe that sees every copy leaves (the return probe
			// before the call-site probes went on, or copy_context()): no
			// owner, so nothing proves it is this Task's context's.
			planted.Owner = 0
		}
		if err := objs.GtPyLinks.Put(born.Ctx, planted); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(s.stdin)
	}
	got := map[string]CtxID{}
	rd.SetDeadline(time.Now().Add(30 * time.Second)) // a bound on a failure
	for len(got) < 3 {
		rec, err := rd.Read()
		if err != nil {
			t.Fatalf("sends seen %v: %v", got, err)
		}
		var e pytestbpf.Event
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &e); err != nil {
			t.Fatal(err)
		}
		if d := string(e.Data[:min(int(e.Len), len(e.Data))]); int(e.Tgid) == in.PID && strings.HasPrefix(d, "S ") {
			got[d[2:]] = CtxID(e.Root)
		}
	}
	if got["A"] != 0 {
		t.Errorf("A's send carries root %s: a dead Task's link with another serial was trusted", got["A"])
	}
	if got["C"] != 0 {
		t.Errorf("C's send carries root %s: a link with no owner was trusted for a running Task", got["C"])
	}
	if got["B"] != roots["B"] {
		t.Errorf("B's send carries root %s, want the planted %s", got["B"], roots["B"])
	}
	if n := statSum(t, objs, StatStale); n == 0 {
		t.Error("no stale link counted")
	}
}
