//go:build linux

package inject

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Kernel behaviours that injection would show the traced programs, found by
// SelfTest at start-up. Injection puts the targets' outbound sockets in a
// sockhash, which swaps their protocol operations for the kernel's tcp_bpf
// ones; where those misreport socket state, the traced program would see a
// wrong value, so injection stays off (docs/injection.md).
type SelfTestResult struct {
	// FIONREADBroken: ioctl(FIONREAD) on a socket in a sockhash reports 0
	// while bytes wait (kernel commit 929e30f93125, in 6.6.128+, 6.12.75+,
	// 6.18.14+ and 6.19, fixed later by 04af4efde58a).
	FIONREADBroken bool
	Waiting, Seen  int // the probe's bytes waiting, and what FIONREAD said
}

// Safe reports whether injection shows the traced programs nothing wrong.
func (r SelfTestResult) Safe() bool { return !r.FIONREADBroken }

// Reason names what is broken, for logs, metrics and `gymtrace check`.
func (r SelfTestResult) Reason() string {
	if r.FIONREADBroken {
		return "fionread"
	}
	return ""
}

func (r SelfTestResult) String() string {
	if r.FIONREADBroken {
		return fmt.Sprintf("this kernel misreports ioctl(FIONREAD) for sockets in a sockhash: %d for %d bytes waiting "+
			"(kernel commit 929e30f93125; fixed by 04af4efde58a)", r.Seen, r.Waiting)
	}
	return fmt.Sprintf("ioctl(FIONREAD) in a sockhash: %d for %d bytes waiting, as untraced", r.Seen, r.Waiting)
}

// SelfTest puts one end of a loopback connection in a sockhash of its own
// (the state the injection sockhash gives a traced program's sockets), lets
// the other end write, and compares what FIONREAD reports with what waits.
// It decides by behaviour, not by kernel version, so a fixed or a backported
// kernel is judged by what it does. Needs CAP_BPF (or CAP_SYS_ADMIN) and
// CAP_NET_ADMIN, like injection itself.
func SelfTest() (SelfTestResult, error) {
	var r SelfTestResult
	hash, err := ebpf.NewMap(&ebpf.MapSpec{Name: "gt_selftest", Type: ebpf.SockHash, KeySize: 8, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		return r, fmt.Errorf("creating the self-test sockhash: %w", err)
	}
	defer hash.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, fmt.Errorf("self-test listener: %w", err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return r, fmt.Errorf("self-test connection: %w", err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		return r, fmt.Errorf("self-test accept: %w", err)
	}
	defer server.Close()
	raw, err := client.(*net.TCPConn).SyscallConn()
	if err != nil {
		return r, err
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return r, err
	}
	key := uint64(1)
	if err := hash.Update(&key, uint32(fd), ebpf.UpdateAny); err != nil {
		return r, fmt.Errorf("putting the self-test socket in the sockhash: %w", err)
	}
	const n = 83
	if _, err := server.Write(make([]byte, n)); err != nil {
		return r, err
	}
	// FIONREAD is what is under test, so arrival is seen with MSG_PEEK.
	buf := make([]byte, n)
	deadline := time.Now().Add(2 * time.Second)
	for {
		m, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == nil && m == n {
			break
		}
		if time.Now().After(deadline) {
			return r, errors.New("self-test: the probe's bytes never arrived")
		}
		time.Sleep(2 * time.Millisecond)
	}
	v, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return r, fmt.Errorf("self-test ioctl(FIONREAD): %w", err)
	}
	r.Waiting, r.Seen = n, v
	r.FIONREADBroken = v != n
	return r, nil
}
