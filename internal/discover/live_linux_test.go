//go:build linux

package discover

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Debian's interpreter: the pyenv python on PATH is not what Gym-like tests use.
const livePython = "/usr/bin/python3"

func startLive(t *testing.T, name string, argv ...string) *exec.Cmd {
	t.Helper()
	if _, err := os.Stat(livePython); err != nil {
		t.Skipf("%s not installed: %v", livePython, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(),
		EnvConfigPath+"="+name,
		EnvConfigDict+"="+name+":\n  resources_servers:\n    live_impl:\n      entrypoint: app.py\n",
	)
	// Its own process group, so cleanup also ends the forked and namespaced children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return cmd
}

// waitFor rescans the real /proc until cond holds for the scan.
func waitFor(t *testing.T, what string, cond func([]*Process) bool) []*Process {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		procs, err := Scan()
		if err != nil {
			t.Fatal(err)
		}
		if cond(procs) {
			return procs
		}
		if time.Now().After(deadline) {
			var names []string
			for _, p := range procs {
				names = append(names, fmt.Sprintf("%d:%s", p.PID, p.ServerName))
			}
			t.Fatalf("%s: not seen in %v", what, names)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func named(procs []*Process, name string) []*Process {
	var out []*Process
	for _, p := range procs {
		if p.ServerName == name {
			out = append(out, p)
		}
	}
	return out
}

func TestLiveScanFindsPythonServerAndForkedWorker(t *testing.T) {
	name := fmt.Sprintf("live_weather_%d", os.Getpid())
	// A bash wrapper, as Gym starts servers, around a python that forks a worker.
	script := `import os, time
if os.fork() == 0:
    time.sleep(60); os._exit(0)
time.sleep(60)`
	cmd := startLive(t, name, "/bin/bash", "-c", livePython+" -c '"+script+"'; true")
	procs := waitFor(t, "python server and its worker", func(ps []*Process) bool { return len(named(ps, name)) == 2 })
	got := named(procs, name)
	parent, worker := got[0], got[1]
	if parent.PPID != cmd.Process.Pid {
		t.Errorf("server's parent = %d, want the bash wrapper %d", parent.PPID, cmd.Process.Pid)
	}
	for _, p := range got {
		if p.PID == cmd.Process.Pid {
			t.Errorf("the bash wrapper %d was taken for a server", p.PID)
		}
		if p.Role != RoleResources || p.NSPID != p.PID || p.StartTime == 0 {
			t.Errorf("pid %d = %+v", p.PID, *p)
		}
	}
	if parent.Worker || !worker.Worker || worker.PPID != parent.PID {
		t.Errorf("worker flags: parent %+v worker %+v", *parent, *worker)
	}

	p, err := Inspect(parent.PID)
	if err != nil || p.ServerName != name || p.Role != RoleResources {
		t.Errorf("Inspect(%d) = %+v, %v", parent.PID, p, err)
	}
}

func TestLiveInspectMissingPID(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	_, err := Inspect(cmd.Process.Pid) // reaped: this PID is free for a while
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("process %d does not exist", cmd.Process.Pid)) {
		t.Errorf("err = %v", err)
	}
}

func TestLiveOtherPIDNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a PID namespace (unshare --pid)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	name := fmt.Sprintf("live_ns_agent_%d", os.Getpid())
	startLive(t, name, unshare, "--pid", "--fork", "--mount-proc", livePython, "-c", "import time; time.sleep(60)")
	procs := waitFor(t, "python in its own PID namespace", func(ps []*Process) bool { return len(named(ps, name)) == 1 })
	p := named(procs, name)[0]
	if p.NSPID != 1 || p.PID == 1 {
		t.Errorf("pid %d nspid %d, want nspid 1 (first process of its namespace)", p.PID, p.NSPID)
	}
}

func TestLiveWatcherExecAndExit(t *testing.T) {
	ch := make(chan change, 10)
	w, err := NewWatcher(WatcherOptions{Discover: true, Interval: -1,
		OnAdd:    func(p *Process) { ch <- change{true, p.PID, p.ServerName} },
		OnRemove: func(p *Process) { ch <- change{false, p.PID, p.ServerName} },
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	time.Sleep(200 * time.Millisecond) // initial sync; other tests' processes may show up
	drain(ch)

	name := fmt.Sprintf("live_late_%d", os.Getpid())
	cmd := startLive(t, name, livePython, "-c", "import time; time.sleep(60)")
	pid := cmd.Process.Pid
	// What the loader does on the kernel's exec event (retried: the event can
	// come before the interpreter is in place).
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.OnExec(pid)
		if c, ok := recvFor(ch, pid, 200*time.Millisecond); ok {
			if c != (change{true, pid, name}) {
				t.Fatalf("got %v, want +%d:%s", c, pid, name)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("exec event did not add the server")
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	w.OnExit(pid)
	if c, ok := recvFor(ch, pid, 30*time.Second); !ok || c != (change{false, pid, name}) {
		t.Fatalf("after exit got %v (%v), want -%d:%s", c, ok, pid, name)
	}
}

// recvFor is recv for pid's changes alone: the watcher discovers every Gym
// server on the machine, and other tests (or a Gym stack beside CI) start
// and stop theirs meanwhile.
func recvFor(ch <-chan change, pid int, d time.Duration) (change, bool) {
	deadline := time.Now().Add(d)
	for {
		c, ok := recv(ch, time.Until(deadline))
		if !ok || c.pid == pid {
			return c, ok
		}
	}
}

func drain(ch <-chan change) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func recv(ch <-chan change, d time.Duration) (change, bool) {
	select {
	case c := <-ch:
		return c, true
	case <-time.After(d):
		return change{}, false
	}
}
