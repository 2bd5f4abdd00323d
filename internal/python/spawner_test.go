package python

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	pytestbpf "github.com/gymtrace/gymtrace/internal/python/pytest_bpf"
)

// The spawner rule's liveness check, without a Python in the loop: the flake
// of issue 19 made deterministic. When a request is read on a kept-alive
// connection, the context that wrote that connection's previous response is
// marked as a possible spawner of the request's handler task. That writer may
// have died since, and CPython may have given its address to a new context
// (a new generation in gt_py_links): then it must mark nothing, and above
// all not overwrite the entry the live context at that address holds for
// another connection. Before the fix, two kept-alive requests read in one
// loop iteration did exactly that, and the first request's handler inherited
// its connection's previous root.
//
// This test process stands for the server: it is in gt_py_procs with no
// layout (the read's own context is then not found, so only the previous
// writer is marked), the previous writer comes from pytest_last_resp, and
// the reads are recvfrom(2) calls on socket pairs, as pytest.c's
// sys_exit_recvfrom program expects.
func TestKernelSpawnerLiveness(t *testing.T) {
	objs := loadTestObjects(t)
	attachTP(t, "sys_enter_recvfrom", objs.PytestRecvEnter)
	attachTP(t, "sys_exit_recvfrom", objs.PytestRecvExit)
	pid := uint32(os.Getpid())
	if err := objs.GtPyProcs.Put(pid, Params{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.GtPyProcs.Delete(pid) })

	const addr = 0x7f00_dead_b000 // a context address, as CPython would reuse it
	id := func(gen uint16) CtxID { return CtxID(addr | uint64(gen)<<genShift) }
	// The address's current birth: generation 5.
	if err := objs.GtPyLinks.Put(uint64(addr), Link{Gen: 5, BornNs: 1}); err != nil {
		t.Fatal(err)
	}
	// readRequest makes one server connection whose previous response was
	// written by prev, and reads a request on it.
	readRequest := func(prev CtxID) int32 {
		t.Helper()
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
		fd := int32(fds[0])
		if err := objs.PytestLastResp.Put(uint64(pid)<<32|uint64(uint32(fd)), uint64(prev)); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Write(fds[1], []byte("GET /run/1 HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 256)
		if _, _, err := unix.Recvfrom(int(fd), buf, 0); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	spawner := func() (pytestbpf.Spawner, bool) {
		t.Helper()
		var s pytestbpf.Spawner
		err := objs.GtPySpawners.Lookup(uint64(addr), &s)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return s, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return s, true
	}

	// A dead writer (generation 4) marks nothing.
	readRequest(id(4))
	if s, ok := spawner(); ok {
		t.Fatalf("a dead writer was marked a spawner: %+v", s)
	}
	// The live one (generation 5) is marked for its connection.
	live := readRequest(id(5))
	s, ok := spawner()
	if !ok || CtxID(s.Id) != id(5) || s.Fd != live || s.Tgid != pid || s.ConnId != uint64(live)+1 {
		t.Fatalf("the live writer's spawner entry = %+v (present %v), want %v on fd %d", s, ok, id(5), live)
	}
	// The flake's shape: another connection's previous writer, dead at the
	// same address, must not take the live one's entry over.
	readRequest(id(4))
	if s2, ok := spawner(); !ok || s2 != s {
		t.Fatalf("a dead writer overwrote the live spawner: %+v, want %+v", s2, s)
	}
	// One live context marked by a second connection (uvloop 0.17 reads
	// every connection in one context): a handler born from it could be
	// either's, so the entry roots none (connection 0) and stays so, where
	// it used to name the connection read last (ci18's wrong parent).
	readRequest(id(5))
	if s3, ok := spawner(); !ok || CtxID(s3.Id) != id(5) || s3.ConnId != 0 || s3.Fd != live {
		t.Fatalf("a context marked by two connections = %+v (present %v), want it kept with connection 0", s3, ok)
	}
	readRequest(id(5))
	if s4, ok := spawner(); !ok || s4.ConnId != 0 {
		t.Fatalf("a shared spawner took a connection again: %+v", s4)
	}
}
