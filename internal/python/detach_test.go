package python

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// TestCopyProbeSurvivesOtherDetach: gymtrace takes the link probe off a
// process that only serves while other processes of the same interpreter
// keep theirs (internal/agent, pureWatch). The kernel shares one uprobe per
// file and offset between those attachments; taking one off, again and
// again, must not cost the others a single hit.
func TestCopyProbeSurvivesOtherDetach(t *testing.T) {
	objs, which := probeTestSetup(t)

	// B: a second interpreter of the same build, idle, whose probe comes
	// and goes.
	var helloB struct{ PID int }
	startJSON(t, pyCmd(t, which, testdataScript(t, "cost_loop.py"), "copy", "1"), &helloB)
	inB, err := InspectInterpreter(helloB.PID)
	if err != nil {
		t.Fatal(err)
	}
	// A: 5 x n copies with its probe on throughout.
	const n = 300000
	var helloA struct{ PID int }
	a := startJSON(t, pyCmd(t, which, testdataScript(t, "cost_loop.py"), "copy", fmt.Sprint(n)), &helloA)
	inA, err := InspectInterpreter(helloA.PID)
	if err != nil {
		t.Fatal(err)
	}
	var stA, stB unix.Stat_t
	if unix.Stat(inA.ELFPath, &stA) != nil || unix.Stat(inB.ELFPath, &stB) != nil || stA.Dev != stB.Dev || stA.Ino != stB.Ino {
		t.Fatalf("the two interpreters map different files (%s, %s): the probes would not share a uprobe", inA.ELFPath, inB.ELFPath)
	}
	cA, err := inA.AttachProbes(objs.GtPyCopyRet)
	if err != nil {
		t.Fatal(err)
	}
	defer cA.Close()
	_, before := progStats(t, objs.GtPyCopyRet)

	var stop atomic.Bool
	var wg sync.WaitGroup
	var cycles int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			c, err := inB.AttachProbes(objs.GtPyCopyRet)
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
			c.Close()
			cycles++
		}
	}()
	fmt.Fprintln(a.stdin, "go")
	line, err := a.out.ReadBytes('\n')
	stop.Store(true)
	wg.Wait()
	var res struct {
		NsPerCall float64 `json:"ns_per_call"`
	}
	if err != nil || json.Unmarshal(line, &res) != nil {
		t.Fatalf("cost loop gave %q: %v", line, err)
	}
	_, after := progStats(t, objs.GtPyCopyRet)
	got := after - before
	t.Logf("%d attach/detach cycles of the other process's probe; %d probe runs for %d calls", cycles, got, 5*n)
	if cycles < 3 {
		t.Fatalf("only %d detach cycles during the loop: the test proves nothing", cycles)
	}
	if got < 5*n {
		t.Errorf("the probe ran %d times for %d calls: the other process's detach lost %d hits", got, 5*n, 5*n-got)
	}
}

// TestSiteProbesDetachTogether: a process's call-site probes must come off
// in a few kernel detaches, not one per site. Each perf_event uprobe costs
// its detach two RCU grace periods under the kernel's global event_mutex
// (tens of ms idle, up to a second under load), one after another however
// they are closed; with 20-odd sites a process on 3.13 with uvloop, and
// four such processes, a SIGTERM'd gymtrace spent over 15 s detaching
// (issue 37, TestLateStarters py3.13_uvloop). One uprobe_multi link per
// program and module detaches them all with one grace period.
func TestSiteProbesDetachTogether(t *testing.T) {
	requireRoot(t)
	if !probesite.MultiWanted() {
		t.Skip("this kernel attaches uprobes one by one (no uprobe_multi, or before 6.11): nothing to group")
	}
	objs := loadTestObjects(t)
	var hello struct{ PID int }
	// uvloop imported: its module copies contexts at a score of call sites.
	startJSON(t, pyCmd(t, "trixie", testdataScript(t, "ctx_sender.py"), "8", "5", "uvloop"), &hello)
	in, err := InspectInterpreter(hello.PID)
	if err != nil {
		t.Fatal(err)
	}
	mods, _, err := copyModules(in.PID)
	if err != nil {
		t.Fatal(err)
	}
	sites := 0
	for _, m := range mods {
		fc, err := readCalls(m.open, m.id)
		if err != nil || fc.err != nil {
			t.Fatalf("%s: %v %v", m.path, err, fc.err)
		}
		sites += len(fc.calls.Sites) + len(fc.calls.Returns)
	}
	c, _, err := in.AttachSiteProbes(objs.GtPyCopySite, objs.GtPyCopyRet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.(*Probes)
	// Per module one link for the sites and one for the wrappers' returns,
	// and one for contextvars.Context()'s return.
	if want := 2*len(mods) + 1; len(p.links) > want {
		t.Errorf("%d links for %d probes in %d modules, want at most %d: each link is a detach of its own",
			len(p.links), sites, len(mods), want)
	}
	t.Logf("%d probes in %d modules: %d links", sites, len(mods), len(p.links))
}
