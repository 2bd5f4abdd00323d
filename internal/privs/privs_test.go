//go:build linux

package privs

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/cap"
)

func caps(ns []need) []string {
	var out []string
	for _, n := range ns {
		out = append(out, Name(n.c))
	}
	return out
}

func TestNeedsList(t *testing.T) {
	for _, tc := range []struct {
		n      Needs
		oldBPF bool
		want   string
	}{
		{Needs{}, false, ""},
		{Needs{Discovery: true}, false, "cap_sys_ptrace,cap_dac_read_search"},
		{Needs{Discovery: true}, true, "cap_sys_ptrace,cap_dac_read_search,cap_bpf"},
		{Needs{Uprobes: true}, false, "cap_sys_ptrace,cap_dac_read_search,cap_sys_admin,cap_perfmon,cap_bpf,cap_checkpoint_restore"},
		{Needs{Discovery: true, Uprobes: true}, true, "cap_sys_ptrace,cap_dac_read_search,cap_sys_admin,cap_perfmon,cap_bpf,cap_checkpoint_restore"},
	} {
		got := strings.ToLower(strings.Join(caps(tc.n.list(tc.oldBPF)), ","))
		if got != tc.want {
			t.Errorf("%+v (bpf checked on every call: %v): %q, want %q", tc.n, tc.oldBPF, got, tc.want)
		}
	}
}

// TestDropEveryThread runs Drop in a child process (this test binary) with
// many OS threads and checks each thread's sets: capabilities are per thread,
// and a drop that reached one thread only would leave the rest privileged.
func TestDropEveryThread(t *testing.T) {
	if os.Getenv("GT_PRIVS_CHILD") == "1" {
		return
	}
	c := cap.GetProc()
	if ok, _ := c.GetFlag(cap.Effective, cap.SETPCAP); !ok || os.Geteuid() != 0 {
		t.Skip("needs root with CAP_SETPCAP (run `sudo go test ./internal/privs/`)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDropChild$", "-test.v")
	cmd.Env = append(os.Environ(), "GT_PRIVS_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := fmt.Sprintf("%016x", uint64(1)<<unix.CAP_SYS_PTRACE|uint64(1)<<unix.CAP_DAC_READ_SEARCH)
	var threads int
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 7 || f[0] != "thread" {
			continue
		}
		threads++
		for i, name := range []string{"CapEff", "CapPrm", "CapBnd"} {
			if f[2+i] != want {
				t.Errorf("thread %s: %s %s, want %s", f[1], name, f[2+i], want)
			}
		}
		if f[5] != "0000000000000000" || f[6] != "0000000000000000" {
			t.Errorf("thread %s: CapInh %s CapAmb %s, want none", f[1], f[5], f[6])
		}
	}
	if threads < 4 {
		t.Fatalf("child reported %d threads, want at least 4:\n%s", threads, out)
	}
}

// TestDropChild is the child side of TestDropEveryThread.
func TestDropChild(t *testing.T) {
	if os.Getenv("GT_PRIVS_CHILD") != "1" {
		t.Skip("run by TestDropEveryThread")
	}
	// Park goroutines on their own OS threads, created before the drop.
	var ready, release sync.WaitGroup
	release.Add(1)
	for range 6 {
		ready.Add(1)
		go func() {
			runtime.LockOSThread()
			ready.Done()
			release.Wait()
		}()
	}
	ready.Wait()
	rep, err := Drop(Needs{Discovery: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.BoundingReduced {
		t.Error("bounding set not reduced")
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		vals := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				vals[k] = strings.TrimSpace(v)
			}
		}
		fmt.Printf("thread %s %s %s %s %s %s\n", e.Name(), vals["CapEff"], vals["CapPrm"], vals["CapBnd"], vals["CapInh"], vals["CapAmb"])
	}
	release.Done()
}
