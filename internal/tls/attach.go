//go:build linux

package tls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Programs are the kernel programs of bpf/tls.h.
type Programs struct {
	RWEntry   *ebpf.Program // gt_tls_rw_entry: entry of the read and write functions
	RWReturn  *ebpf.Program // gt_tls_rw_ret: their return
	Handshake *ebpf.Program // gt_tls_handshake: SSL_do_handshake entry
	Free      *ebpf.Program // gt_tls_free: SSL_free entry
}

func (p Programs) valid() error {
	if p.RWEntry == nil || p.RWReturn == nil || p.Handshake == nil || p.Free == nil {
		return errors.New("the loaded BPF object has no TLS programs (gt_tls_*): rebuild it with ./scripts/gen-bpf")
	}
	return nil
}

// Options tune an Attacher. Zero values take the defaults.
type Options struct {
	// Rescan is how often Run looks for TLS libraries mapped after the
	// process was added (a lazy `import ssl`). Default 2s.
	Rescan time.Duration
	Log    *slog.Logger
	// ProcRoot is /proc (tests point it elsewhere).
	ProcRoot string
}

// Library is one OpenSSL copy attached in one process.
type Library struct {
	Path   string // as mapped in the process
	Static bool   // OpenSSL linked into an executable or another library
	Sites  Sites
}

// Attacher places the TLS probes on the OpenSSL copies of target processes,
// follows libraries they map later, and detaches. Safe for concurrent use.
type Attacher struct {
	progs Programs
	opt   Options
	log   *slog.Logger

	mu      sync.Mutex
	enabled bool
	closed  bool // Close ran: nothing is attached again
	procs   map[int]*proc
	// Files known to hold no OpenSSL, and sites of those that do, by
	// inode: a file is read once however many processes map it.
	noSSL map[fileKey]bool
	sites map[fileKey]*Sites
}

type proc struct {
	libs    map[fileKey]*attached
	skipped map[fileKey]bool // files that failed to attach: not retried every rescan
}

type attached struct {
	lib   Library
	links []link.Link
}

// NewAttacher returns an attacher for the given programs. It attaches
// nothing until Add is called while enabled.
func NewAttacher(progs Programs, opt Options) (*Attacher, error) {
	if err := progs.valid(); err != nil {
		return nil, err
	}
	if opt.Rescan <= 0 {
		opt.Rescan = 2 * time.Second
	}
	if opt.ProcRoot == "" {
		opt.ProcRoot = "/proc"
	}
	log := opt.Log
	if log == nil {
		log = slog.Default()
	}
	return &Attacher{
		progs:   progs,
		opt:     opt,
		log:     log.With("component", "tls"),
		enabled: true,
		procs:   map[int]*proc{},
		noSSL:   map[fileKey]bool{},
		sites:   map[fileKey]*Sites{},
	}, nil
}

// SetEnabled turns probing on or off for every added process. Off detaches
// every probe (the processes take no trap at all); on attaches again. Call
// it when the span groups change: TLS probes are needed only while
// http_client or server is enabled.
func (a *Attacher) SetEnabled(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.enabled == on || a.closed {
		return
	}
	a.enabled = on
	for pid, p := range a.procs {
		if on {
			a.scanLocked(pid, p)
		} else {
			a.detachLocked(pid, p)
		}
	}
}

// Add starts following pid: its OpenSSL copies are probed now (when
// enabled) and at every rescan. A process without OpenSSL is not an error:
// it may import ssl later.
func (a *Attacher) Add(pid int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	p := a.procs[pid]
	if p == nil {
		p = &proc{libs: map[fileKey]*attached{}, skipped: map[fileKey]bool{}}
		a.procs[pid] = p
	}
	if !a.enabled {
		return nil
	}
	return a.scanLocked(pid, p)
}

// Remove detaches every probe of pid and forgets it.
func (a *Attacher) Remove(pid int) {
	for _, c := range a.Take(pid) {
		_ = c.Close()
	}
}

// Take forgets pid and returns its probes, still attached, for the caller
// to close: detaching a uprobe waits for the kernel (about a second on a
// loaded machine), which a process that has exited need not make anyone
// wait for. A process with the same pid added later gets probes of its own.
func (a *Attacher) Take(pid int) []io.Closer {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.procs[pid]
	if p == nil {
		return nil
	}
	delete(a.procs, pid)
	var out []io.Closer
	for _, l := range p.take() {
		out = append(out, l)
	}
	return out
}

// Libraries lists what is attached in pid, sorted by path.
func (a *Attacher) Libraries(pid int) []Library {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.procs[pid]
	if p == nil {
		return nil
	}
	var out []Library
	for _, at := range p.libs {
		out = append(out, at.lib)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Rescan looks at every followed process again: new OpenSSL mappings are
// probed, processes that are gone are dropped.
func (a *Attacher) Rescan() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.enabled {
		return
	}
	for pid, p := range a.procs {
		if err := a.scanLocked(pid, p); errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			a.detachLocked(pid, p)
			delete(a.procs, pid)
		}
	}
}

// Run rescans every Options.Rescan until ctx ends, then detaches everything.
func (a *Attacher) Run(ctx context.Context) error {
	t := time.NewTicker(a.opt.Rescan)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return a.Close()
		case <-t.C:
			a.Rescan()
		}
	}
}

// Close detaches every probe, all at once (probesite.CloseAll), and stops
// the attacher: processes added or rescanned after attach nothing.
func (a *Attacher) Close() error {
	a.mu.Lock()
	a.closed, a.enabled = true, false
	var links []link.Link
	for _, p := range a.procs {
		links = append(links, p.take()...)
	}
	a.procs = map[int]*proc{}
	a.mu.Unlock()
	if err := probesite.CloseAll(links); err != nil {
		return fmt.Errorf("detaching TLS probes: %w", err)
	}
	return nil
}

func (a *Attacher) detachLocked(pid int, p *proc) error {
	if err := probesite.CloseAll(p.take()); err != nil {
		return fmt.Errorf("detaching TLS probes from process %d: %w", pid, err)
	}
	clear(p.skipped)
	return nil
}

// take forgets p's libraries and returns their probes, still attached.
func (p *proc) take() []link.Link {
	var out []link.Link
	for k, at := range p.libs {
		out = append(out, at.links...)
		delete(p.libs, k)
	}
	return out
}

// scanLocked attaches to the OpenSSL copies pid maps that are not attached
// yet. Candidates: libssl* files, the main executable, and any other
// executable mapping whose dynamic symbols define SSL_read (a library that
// links OpenSSL statically); each file's symbols are read once.
func (a *Attacher) scanLocked(pid int, p *proc) error {
	maps, err := execMappings(a.opt.ProcRoot, pid)
	if err != nil {
		return fmt.Errorf("reading the memory map of process %d: %w", pid, err)
	}
	exe, _ := os.Readlink(filepath.Join(a.opt.ProcRoot, fmt.Sprint(pid), "exe"))
	var errs []error
	for _, m := range maps {
		k := m.key()
		if p.libs[k] != nil || p.skipped[k] || a.noSSL[k] {
			continue
		}
		sites, path, err := a.sitesFor(pid, m, m.path == exe)
		if err != nil {
			p.skipped[k] = true
			errs = append(errs, err)
			continue
		}
		if sites == nil {
			continue
		}
		at, err := a.attach(pid, path, sites)
		if err != nil {
			p.skipped[k] = true
			errs = append(errs, err)
			continue
		}
		at.lib.Path = m.path
		p.libs[k] = at
		lvl := slog.LevelInfo
		if !sites.Read.Cheap || !sites.Write.Cheap {
			lvl = slog.LevelWarn // single-stepped probes: tens of µs a call
		}
		a.log.Log(context.Background(), lvl, "TLS probes attached", "pid", pid, "library", m.path,
			"static", sites.Static, "read", sites.Read.Symbol, "write", sites.Write.Symbol,
			"emulated", sites.Read.Cheap && sites.Write.Cheap)
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		msg := "some TLS libraries could not be probed: HTTPS through them is not traced"
		if errors.Is(err, os.ErrPermission) {
			msg += " (attaching uprobes needs CAP_PERFMON, CAP_BPF and, on some kernels (6.18), CAP_SYS_ADMIN:" +
				" gymtrace gives them up after attaching when neither http_client nor server is enabled; restart it with one of them)"
		}
		a.log.Warn(msg, "pid", pid, "error", err)
		return err
	}
	return nil
}

// sitesFor returns the probe sites of mapping m (nil when it holds no
// OpenSSL) and the path to attach through.
func (a *Attacher) sitesFor(pid int, m mapping, isExe bool) (*Sites, string, error) {
	k := m.key()
	if !isLibSSL(m.path) && !isExe && !cheapCandidate(m.path) {
		a.noSSL[k] = true
		return nil, "", nil
	}
	var lastErr error
	for _, path := range openPaths(a.opt.ProcRoot, pid, m) {
		if !sameInode(path, m.inode) {
			continue
		}
		if s := a.sites[k]; s != nil {
			return s, path, nil
		}
		s, err := FindSites(path)
		if IsNoOpenSSL(err) {
			a.noSSL[k] = true
			return nil, "", nil
		}
		if err != nil {
			lastErr = err
			continue
		}
		a.sites[k] = s
		return s, path, nil
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no path to it opens the mapped file (map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE)")
	}
	return nil, "", fmt.Errorf("reading %s of process %d: %w", m.path, pid, lastErr)
}

// cheapCandidate: other libraries are read only if their name suggests they
// may carry a TLS stack; reading every mapped library's symbols (hundreds in
// a Python ML process) would cost more than it finds.
func cheapCandidate(path string) bool {
	base := strings.ToLower(filepath.Base(path))
	for _, s := range []string{"ssl", "tls", "crypto"} {
		if strings.Contains(base, s) {
			return true
		}
	}
	return false
}

func sameInode(path string, inode uint64) bool {
	var st syscall.Stat_t
	return syscall.Stat(path, &st) == nil && st.Ino == inode
}

// attach places every probe of sites on the file at path, filtered to pid
// (other processes mapping the same library take no trap).
func (a *Attacher) attach(pid int, path string, s *Sites) (*attached, error) {
	ex, err := link.OpenExecutable(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s of process %d for uprobes: %w", path, pid, err)
	}
	at := &attached{lib: Library{Path: path, Static: s.Static, Sites: *s}}
	// One link per program (probesite.Attach): the read and write entries
	// together, their returns together.
	var rw []probesite.Spec
	for _, site := range []Site{s.Read, s.Write} {
		cookie := uint64(site.Flavor)
		if site.Write {
			cookie |= cookieWrite
		}
		rw = append(rw, probesite.Spec{Address: site.Offset, Cookie: cookie})
	}
	type set struct {
		what  string
		prog  *ebpf.Program
		ret   bool
		specs []probesite.Spec
	}
	probes := []set{
		{s.Read.Symbol + " and " + s.Write.Symbol + " entry", a.progs.RWEntry, false, rw},
		{s.Read.Symbol + " and " + s.Write.Symbol + " return", a.progs.RWReturn, true, rw},
		{"SSL_do_handshake", a.progs.Handshake, false, []probesite.Spec{{Address: s.Handshake.Offset}}},
	}
	if s.Free.Offset != 0 {
		probes = append(probes, set{"SSL_free", a.progs.Free, false, []probesite.Spec{{Address: s.Free.Offset}}})
	}
	for _, p := range probes {
		ls, err := probesite.Attach(ex, p.prog, pid, p.ret, p.specs)
		if err != nil {
			for _, l := range at.links {
				l.Close()
			}
			return nil, fmt.Errorf("attaching the TLS %s probe to %s in process %d: %w", p.what, path, pid, err)
		}
		at.links = append(at.links, ls...)
	}
	return at, nil
}
