package python

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"

	pytestbpf "github.com/gymtrace/gymtrace/internal/python/pytest_bpf"
)

func loadTestObjects(t *testing.T) *pytestbpf.Objects {
	t.Helper()
	requireRoot(t)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	objs, err := pytestbpf.Load()
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("loading the test BPF object: %+v", ve)
		}
		t.Fatalf("loading the test BPF object: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs
}

func attachTP(t *testing.T, name string, prog *ebpf.Program) {
	t.Helper()
	l, err := link.Tracepoint("syscalls", name, prog, nil)
	if err != nil {
		t.Fatalf("attaching %s: %v", name, err)
	}
	t.Cleanup(func() { l.Close() })
}

type sendEvent struct {
	ctx, root CtxID
	status    Status
	tid       uint32
	data      string
}

// runSender runs ctx_sender.py on an interpreter with the kernel side
// attached and returns every send it made, as the kernel saw it.
// How runSender links contexts: not at all, with the return probe on every
// copy, or with the task-only probes (AttachTaskProbes, FlagTasks).
type senderProbes int

const (
	noLinks senderProbes = iota
	retLinks
	taskLinks     // every Task birth (GYMTRACE_PY_EAGER=0)
	lazyTaskLinks // lazily started Tasks' births (FlagEager)
)

func runSender(t *testing.T, which string, objs *pytestbpf.Objects, probes senderProbes, args ...string) ([]sendEvent, *Interpreter) {
	t.Helper()
	cmd := pyCmd(t, which, testdataScript(t, "ctx_sender.py"), append([]string{"8", "5"}, args...)...)
	var hello struct {
		PID     int    `json:"pid"`
		Version string `json:"version"`
	}
	s := startJSON(t, cmd, &hello)
	in, err := InspectInterpreter(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	key := uint32(in.PID)
	params := in.Params
	switch probes {
	case retLinks:
		c, err := in.AttachProbes(objs.GtPyCopyRet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	case taskLinks, lazyTaskLinks:
		was := eagerOff
		eagerOff = probes == taskLinks
		c, l, _, err := in.AttachTaskProbes(objs.GtPyCopySite, objs.GtPyCopyRet)
		eagerOff = was
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if probes == lazyTaskLinks && !l.Eager {
			t.Fatalf("the probe could not move past eager starts: %v", l.EagerErr)
		}
		l.Apply(&params)
	}
	if err := objs.GtPyProcs.Put(key, params); err != nil {
		t.Fatalf("writing gt_py_procs: %v", err)
	}
	t.Cleanup(func() { objs.GtPyProcs.Delete(key) })
	rd, err := ringbuf.NewReader(objs.PytestEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()

	fmt.Fprintln(s.stdin, "go")
	var done struct {
		Sent int `json:"sent"`
	}
	line, err := s.out.ReadBytes('\n')
	if err != nil || json.Unmarshal(line, &done) != nil {
		t.Fatalf("sender ended without its summary (%q): %v", line, err)
	}
	var out []sendEvent
	rd.SetDeadline(time.Now().Add(30 * time.Second)) // a bound on a failure
	for len(out) < done.Sent {
		rec, err := rd.Read()
		if err != nil {
			t.Fatalf("read %d of %d sends from the ring buffer: %v", len(out), done.Sent, err)
		}
		var e pytestbpf.Event
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &e); err != nil {
			t.Fatal(err)
		}
		if int(e.Tgid) != in.PID {
			continue
		}
		n := min(int(e.Len), len(e.Data))
		data := string(e.Data[:n])
		if len(data) < 2 || !strings.Contains("XPC", data[:1]) || data[1] != ' ' {
			continue // the interpreter's own writes (stdout), the fake requests
		}
		out = append(out, sendEvent{ctx: CtxID(e.Ctx), root: CtxID(e.Root), status: Status(e.Status), tid: e.Tid, data: data})
	}
	return out, in
}

// TestKernelContextPerTask proves gt_py_context, the link probe and the
// request roots on live interpreters: a task's sends carry exactly its
// Context; every descendant of a request task (create_task, gather, nested,
// eager, call_soon) carries that request's root and no other's.
func TestKernelContextPerTask(t *testing.T) {
	for _, which := range []string{"debian", "trixie"} {
		t.Run(which, func(t *testing.T) {
			objs := loadTestObjects(t)
			attachTP(t, "sys_enter_sendto", objs.PytestSendto)
			attachTP(t, "sys_enter_recvfrom", objs.PytestRecvEnter)
			attachTP(t, "sys_exit_recvfrom", objs.PytestRecvExit)
			events, in := runSender(t, which, objs, retLinks)
			kinds, requests := checkSends(t, events, retLinks)
			t.Logf("CPython %s: %d sends checked: %v", in.Version, len(events), kinds)
			wantKinds := []string{"explicit", "request", "task", "gather", "nested", "soon", "thread"}
			if in.Version.Minor >= 12 {
				wantKinds = append(wantKinds, "eager")
			}
			for _, k := range wantKinds {
				if kinds[k] == 0 {
					t.Errorf("no %q sends seen", k)
				}
			}
			if requests != 8 {
				t.Errorf("%d requests have roots, want 8", requests)
			}
			logStats(t, objs.GtPyStats)
		})
	}
}

// checkSends checks ctx_sender.py's sends: an explicit context's sends
// carry exactly it; a request task is its own root and every descendant
// carries that root and no other request's. With task-only links
// (taskLinks, lazyTaskLinks) call_soon callbacks run in contexts born
// unseen, so theirs must carry no root and no generation. With
// lazyTaskLinks an eager task that sends nothing in its eager step, or
// whose creator is an eager task that has sent nothing yet, may carry no
// root (never another request's). It returns the sends seen by kind and
// how many requests have roots.
func checkSends(t *testing.T, events []sendEvent, probes senderProbes) (map[string]int, int) {
	t.Helper()
	kinds := map[string]int{}
	unlinked := 0
	defer func() {
		if unlinked > 0 {
			t.Logf("%d sends of eager tasks unattributed (allowed)", unlinked)
		}
	}()
	rootOf := map[string]CtxID{} // request k -> root
	kOf := map[CtxID]string{}    // root -> request k
	for _, e := range events {
		f := strings.Fields(e.data)
		if e.status != StatusOK {
			t.Errorf("%q: status %s", e.data, e.status)
			continue
		}
		switch f[0] {
		case "X":
			kinds["explicit"]++
			if want := hexAddr(t, f[1]); e.ctx.Addr() != want {
				t.Errorf("%q: kernel read context %s", e.data, e.ctx)
			}
			continue
		case "P":
			kinds["request"]++
			if e.root != e.ctx {
				t.Errorf("%q: request task %s has root %s, want itself", e.data, e.ctx, e.root)
			}
		case "C":
			kinds[f[2]]++
			if probes >= taskLinks && f[2] == "soon" {
				if e.root != 0 || e.ctx.Gen() != 0 {
					t.Errorf("%q: a handle's context (not a task's) has root %s, context %s; want neither trusted", e.data, e.root, e.ctx)
				}
				continue
			}
			if probes == lazyTaskLinks && e.root == 0 && (f[2] == "eager_quiet" || f[2] == "eager_chain") {
				unlinked++ // born unseen, and no eager step of its own linked it
				continue
			}
			if e.root == e.ctx {
				t.Errorf("%q: a child is its own root", e.data)
			}
		}
		k := f[1]
		if e.root == 0 {
			t.Errorf("%q: no root", e.data)
			continue
		}
		if r, ok := rootOf[k]; ok && r != e.root {
			t.Errorf("%q: root %s, request %s's other sends have %s", e.data, e.root, k, r)
		}
		if other, ok := kOf[e.root]; ok && other != k {
			t.Errorf("%q: root %s also names request %s", e.data, e.root, other)
		}
		rootOf[k], kOf[e.root] = e.root, k
	}
	return kinds, len(rootOf)
}

// mapStat is counter s of gt_py_stats m, summed over the CPUs.
func mapStat(t *testing.T, m *ebpf.Map, s Status) uint64 {
	t.Helper()
	var per []uint64
	if err := m.Lookup(uint32(s), &per); err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum
}

func logStats(t *testing.T, m *ebpf.Map) {
	var parts []string
	for s := Status(0); s < statMax; s++ {
		if sum := mapStat(t, m, s); sum > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", s, sum))
		}
	}
	t.Logf("gt_py_stats: %s", strings.Join(parts, " "))
}

// TestParamsLayout checks that the Go mirrors have the C structs' layout.
func TestParamsLayout(t *testing.T) {
	spec, err := pytestbpf.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		goV  any
	}{{"gt_py_params", Params{}}, {"gt_py_link", Link{}}} {
		var st *btf.Struct
		if err := spec.Types.TypeByName(c.name, &st); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := binary.Size(c.goV); uint32(got) != st.Size {
			t.Errorf("%s: Go size %d, C size %d", c.name, got, st.Size)
		}
	}
}

// TestStatusContract checks the Go mirror of enum gt_py_status against the
// C enum (through the test object's BTF, compiled from the same header): the
// same values under the same names, and none left out.
func TestStatusContract(t *testing.T) {
	spec, err := pytestbpf.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("gt_py_status", &e); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range e.Values {
		if v.Name == "GT_PY_STAT_MAX" {
			if Status(v.Value) != statMax {
				t.Errorf("GT_PY_STAT_MAX is %d in C, statMax %d in Go", v.Value, statMax)
			}
			continue
		}
		n++
		want := strings.ToLower(strings.TrimPrefix(v.Name, "GT_PY_"))
		if got := Status(v.Value).String(); got != want {
			t.Errorf("%s (%d) is %q in Go, want %q", v.Name, v.Value, got, want)
		}
	}
	if n != int(statMax) {
		t.Errorf("C has %d statuses, Go's statMax is %d", n, statMax)
	}
}

// TestSiteRegContract checks siteRegs (the cookies AttachSiteProbes gives a
// call-site probe) against enum gt_py_reg, which gt_py_site_reg switches
// on: every C register named the same in Go with the same value.
func TestSiteRegContract(t *testing.T) {
	spec, err := pytestbpf.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("gt_py_reg", &e); err != nil {
		t.Fatal(err)
	}
	byName := map[string]uint64{}
	for r, v := range siteRegs {
		byName[r.String()] = v
	}
	for _, v := range e.Values {
		name := strings.TrimPrefix(v.Name, "GT_PY_REG_")
		if !strings.HasPrefix(name, "R") {
			name = "R" + name // AX -> RAX; R8..R15 as they are
		}
		got, ok := byName[name]
		if !ok || got != v.Value {
			t.Errorf("%s = %d in C; siteRegs[%s] = %d (present %v)", v.Name, v.Value, name, got, ok)
		}
		delete(byName, name)
	}
	if len(byName) > 0 {
		t.Errorf("siteRegs has registers C does not: %v", byName)
	}
	var fl *btf.Enum
	if err := spec.Types.TypeByName("gt_py_site_flag", &fl); err != nil {
		t.Fatal(err)
	}
	if len(fl.Values) != 1 || fl.Values[0].Value != regTask {
		t.Errorf("enum gt_py_site_flag is %+v, want GT_PY_SITE_TASK = %#x (regTask)", fl.Values, regTask)
	}
}
