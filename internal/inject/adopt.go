//go:build linux

package inject

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// AdoptConnections puts pid's established outbound TCP connections into the
// injection sockhash, as the sock_ops program does for connections made
// after attach. Without it, a process gymtrace attached to while it ran
// (`--pid`, or discovery of a running Gym) would keep its pooled keep-alive
// connections, which Gym's clients hold for as long as traffic flows, out
// of injection for good. Each socket is borrowed with pidfd_getfd(2) (needs
// CAP_SYS_PTRACE, which gymtrace keeps for discovery), its cookie read, and
// the sockhash takes its own reference; the borrowed descriptor is closed.
// Inbound (accepted) connections are left alone: nothing is injected there.
// It returns how many sockets it added; a socket already held (by another
// gymtrace tracing the same process) or closed meanwhile is skipped.
func (in *Injector) AdoptConnections(pid int) (int, error) {
	if in == nil {
		return 0, nil
	}
	if in.p.Socks == nil || in.p.Procs == nil {
		return 0, errors.New("adopting connections: the sockhash or gt_inject_procs map is missing")
	}
	fds, err := outboundFDs(pid)
	if err != nil || len(fds) == 0 {
		return 0, err
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("adopting connections of pid %d: pidfd_open: %w", pid, err)
	}
	defer unix.Close(pidfd)
	added := 0
	var firstErr error
	for _, fd := range fds {
		dup, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			if errors.Is(err, unix.EBADF) {
				continue // closed since /proc was read
			}
			if firstErr == nil {
				firstErr = fmt.Errorf("pidfd_getfd of pid %d fd %d (needs CAP_SYS_PTRACE): %w", pid, fd, err)
			}
			continue
		}
		cookie, err := unix.GetsockoptUint64(dup, unix.SOL_SOCKET, unix.SO_COOKIE)
		if err == nil {
			err = in.do(func() error { return in.p.Socks.Update(cookie, uint64(dup), ebpf.UpdateNoExist) })
		}
		unix.Close(dup)
		switch {
		case err == nil:
			added++
		case errors.Is(err, ebpf.ErrKeyExist), errors.Is(err, unix.EBUSY), errors.Is(err, unix.EOPNOTSUPP):
			// Held already, or no longer established (a sockhash takes
			// established TCP sockets only).
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("adding pid %d fd %d to the injection sockhash: %w", pid, fd, err)
			}
		}
	}
	if added > 0 {
		if err := in.do(func() error { return in.p.Procs.Put(uint32(pid), uint8(1)) }); err != nil {
			return added, fmt.Errorf("marking pid %d as injectable: %w", pid, err)
		}
	}
	return added, firstErr
}

// outboundFDs lists pid's descriptors that are established TCP connections
// it opened (its local port is not one a socket listens on in its network
// namespace), read from /proc/PID/fd and /proc/PID/net/tcp{,6}.
func outboundFDs(pid int) ([]int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing the descriptors of pid %d: %w", pid, err)
	}
	inodeFD := map[uint64]int{}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
		fd, ferr := strconv.Atoi(e.Name())
		if err == nil && ferr == nil {
			inodeFD[ino] = fd
		}
	}
	if len(inodeFD) == 0 {
		return nil, nil
	}
	var tables []string
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6
			}
			return nil, fmt.Errorf("reading the TCP table of pid %d: %w", pid, err)
		}
		tables = append(tables, string(b))
	}
	return outboundInTables(tables, inodeFD), nil
}

// tcpEntry is one row of /proc/net/tcp: local port, state, socket inode.
type tcpEntry struct {
	lport uint64
	state string
	inode uint64
}

func parseTCPTable(table string) []tcpEntry {
	var out []tcpEntry
	lines := strings.Split(table, "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		lport, err1 := strconv.ParseUint(f[1][i+1:], 16, 16)
		inode, err2 := strconv.ParseUint(f[9], 10, 64)
		if err1 == nil && err2 == nil {
			out = append(out, tcpEntry{lport: lport, state: f[3], inode: inode})
		}
	}
	return out
}

// outboundInTables picks, from the process's sockets (inode -> fd), the
// ESTABLISHED ones whose local port no socket in the tables listens on.
func outboundInTables(tables []string, inodeFD map[uint64]int) []int {
	const established, listen = "01", "0A"
	var entries []tcpEntry
	for _, t := range tables {
		entries = append(entries, parseTCPTable(t)...)
	}
	listening := map[uint64]bool{}
	for _, e := range entries {
		if e.state == listen {
			listening[e.lport] = true
		}
	}
	var fds []int
	for _, e := range entries {
		if fd, ok := inodeFD[e.inode]; ok && e.state == established && !listening[e.lport] {
			fds = append(fds, fd)
		}
	}
	return fds
}

// ReleaseConnections takes every socket out of the injection sockhash and
// forgets which processes own one: for a reload that turns http_client off,
// after which the kernel adds none (gt_inject_wanted). Their writes then
// take the plain TCP path again instead of passing the sk_msg program.
// AdoptConnections puts them back when http_client comes on again.
func (in *Injector) ReleaseConnections() error {
	if in == nil {
		return nil
	}
	var errs []error
	for _, m := range []*ebpf.Map{in.p.Socks, in.p.Procs} {
		if m == nil {
			continue
		}
		if err := clearMap(m, in.do); err != nil {
			errs = append(errs, fmt.Errorf("emptying %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// clearMap deletes every key of a hash-like map. Keys are collected first
// (deleting while walking would restart the walk), at most MaxEntries of
// them, since the kernel may add keys meanwhile.
func clearMap(m *ebpf.Map, mapDo func(func() error) error) error {
	var keys [][]byte
	var prev any
	for len(keys) < int(m.MaxEntries()) {
		next, err := m.NextKeyBytes(prev)
		if err != nil {
			return err
		}
		if next == nil {
			break
		}
		keys = append(keys, next)
		prev = next
	}
	return mapDo(func() error {
		for _, k := range keys {
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		return nil
	})
}
