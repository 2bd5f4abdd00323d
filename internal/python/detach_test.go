package python

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
