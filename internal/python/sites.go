package python

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/arch/x86/x86asm"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Call-site link probes (x86-64). The return probe on PyContext_CopyCurrent
// costs every context copy a trap at the function's entry and a second
// kernel entry at its return. Where every call of it in the process is a
// call instruction whose result an emulated instruction right after still
// has in a register, an entry probe there sees the new context with one
// trap (internal/probesite.FindCalls). Wrappers reached only through a
// method table (contextvars.copy_context) keep a return probe of their own.
// docs/python-causality.md, "Call-site probes".

// siteRegs maps the registers probesite reports to gt_py_site_reg's cookies
// (enum gt_py_reg in bpf/common/python_contract.h).
var siteRegs = map[x86asm.Reg]uint64{
	x86asm.RAX: 0, x86asm.RBX: 1, x86asm.RCX: 2, x86asm.RDX: 3, x86asm.RSI: 4, x86asm.RDI: 5, x86asm.RBP: 6,
	x86asm.R8: 7, x86asm.R9: 8, x86asm.R10: 9, x86asm.R11: 10, x86asm.R12: 11, x86asm.R13: 12, x86asm.R14: 13, x86asm.R15: 14,
}

// regTask is or'ed into the cookie of a probe whose register holds a Task,
// not a context (GT_PY_SITE_TASK).
const regTask = 0x100

// copyModule is one mapped file that defines or imports PyContext_CopyCurrent.
type copyModule struct {
	path string // as mapped
	open string // the path that opens it from here
	id   fileID
}

type fileID struct {
	dev, ino   uint64
	size, time int64
}

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, time: st.Mtim.Nano()}, nil
}

// What files have been read: whether each imports or defines the symbol,
// and what the files that do were read for (readCalls). Every Gym server
// maps the same interpreter and modules, so each is read once per gymtrace.
var siteCache = struct {
	sync.Mutex
	reaches map[fileID]bool
	files   map[fileID]*fileRead
}{reaches: map[fileID]bool{}, files: map[fileID]*fileRead{}}

// fileRead is one file's reading, done or under way: the processes of a
// Gym run start together and map the same interpreter (python-build-
// standalone's is 29 MB, most of a second to read), so the others wait for
// the one reading it.
type fileRead struct {
	done chan struct{}
	fc   *fileCalls
}

// reachesCopy: f defines or imports PyContext_CopyCurrent.
func reachesCopy(open string, id fileID) bool {
	siteCache.Lock()
	r, ok := siteCache.reaches[id]
	siteCache.Unlock()
	if ok {
		return r
	}
	f, err := elf.Open(open)
	if err == nil {
		syms, _ := f.DynamicSymbols()
		r = slices.ContainsFunc(syms, func(s elf.Symbol) bool { return s.Name == ProbeSymbol })
		f.Close()
	}
	siteCache.Lock()
	siteCache.reaches[id] = r
	siteCache.Unlock()
	return r
}

// fileCalls is what one file that reaches PyContext_CopyCurrent was read
// for: how it calls it (probesite.FindCalls) and, where it holds the
// _asyncio module, its task layout (ErrNoTaskLayout everywhere else).
type fileCalls struct {
	calls     *probesite.Calls
	err       error
	layout    TaskLayout
	layoutErr error
	// With the layout and Task.__init__'s one copy stored as a Task's
	// context (taskSites): where the Task probe goes past eager starts
	// (lazySite), or lazyErr.
	lazy    probesite.CallSite
	lazyErr error
}

// readCalls reads the file once per gymtrace, also when several processes
// ask at once; a file that cannot be opened is tried again next time.
func readCalls(open string, id fileID) (*fileCalls, error) {
	siteCache.Lock()
	r := siteCache.files[id]
	if r == nil {
		r = &fileRead{done: make(chan struct{})}
		siteCache.files[id] = r
		siteCache.Unlock()
		fc, err := readCallsOnce(open)
		siteCache.Lock()
		if err != nil {
			delete(siteCache.files, id)
		}
		r.fc = fc
		siteCache.Unlock()
		close(r.done)
		return fc, err
	}
	siteCache.Unlock()
	<-r.done
	if r.fc == nil {
		return readCalls(open, id) // the reader could not open it: try again
	}
	return r.fc, nil
}

func readCallsOnce(open string) (*fileCalls, error) {
	f, err := elf.Open(open)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fc := &fileCalls{}
	fc.calls, fc.err = probesite.FindCalls(f, ProbeSymbol)
	fc.layout, fc.layoutErr = readTaskLayout(f)
	if fc.err == nil && fc.layoutErr == nil {
		if t := taskSites(fc.calls, fc.layout); len(t.Sites) == 1 {
			fc.lazy, fc.lazyErr = lazySite(f, t.Sites[0], fc.layout)
		}
	}
	return fc, nil
}

// copyModules lists pid's mapped files that reach PyContext_CopyCurrent,
// and a key naming that set (a later call compares keys to notice a module
// loaded since).
func copyModules(pid int) ([]copyModule, string, error) {
	maps, err := readMaps(pid)
	if err != nil {
		return nil, "", err
	}
	seen := map[string]bool{}
	var out []copyModule
	var keys []string
	for _, m := range maps {
		k := fmt.Sprintf("%s:%d", m.dev, m.inode)
		if !strings.Contains(m.perms, "x") || seen[k] {
			continue
		}
		seen[k] = true
		var open string
		var id fileID
		for _, p := range mappedPaths(pid, m) {
			if id, err = statID(p); err == nil {
				open = p
				break
			}
		}
		if open == "" {
			return nil, "", fmt.Errorf("reading %s of process %d: %w", m.path, pid, err)
		}
		if reachesCopy(open, id) {
			out = append(out, copyModule{path: m.path, open: open, id: id})
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return out, strings.Join(keys, ","), nil
}

// CopyModulesKey names the set of pid's mapped files that reach
// PyContext_CopyCurrent (see AttachSiteProbes).
func CopyModulesKey(pid int) (string, error) {
	_, key, err := copyModules(pid)
	return key, err
}

// AttachSiteProbes attaches site (gt_py_copy_site) at every call site of
// PyContext_CopyCurrent in the files the process maps, ret (gt_py_copy_ret)
// to the wrappers no call site covers and to contextvars.Context(), all
// filtered to this process. It fails, attaching nothing, unless every way
// the mapped code reaches the function is covered: the caller then keeps
// the return probe (AttachProbes). The key names the files covered: a
// module loaded later that also reaches the function is not, and the
// caller must go back to the return probe when CopyModulesKey changes.
func (in *Interpreter) AttachSiteProbes(site, ret *ebpf.Program) (io.Closer, string, error) {
	if site == nil || ret == nil {
		return nil, "", errors.New("attaching call-site link probes: a program is missing")
	}
	mods, key, err := copyModules(in.PID)
	if err != nil {
		return nil, "", err
	}
	var plan []planned
	for _, m := range mods {
		fc, err := readCalls(m.open, m.id)
		if err == nil {
			err = fc.err
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", m.path, err)
		}
		plan = append(plan, planned{m, fc.calls})
	}
	p, err := in.attachPlan(plan, site, ret)
	if err != nil {
		return nil, "", err
	}
	return p, key, nil
}

// planned: the calls of one module to probe.
type planned struct {
	mod   copyModule
	calls *probesite.Calls
}

// attachPlan attaches site at every planned call site, ret at every planned
// wrapper and at contextvars.Context(), filtered to the process; all or
// nothing.
func (in *Interpreter) attachPlan(plan []planned, site, ret *ebpf.Program) (*Probes, error) {
	p := &Probes{}
	fail := func(err error) (*Probes, error) {
		_ = p.Close()
		return nil, err
	}
	for _, pl := range plan {
		if len(pl.calls.Sites) == 0 && len(pl.calls.Returns) == 0 {
			continue
		}
		f, err := elf.Open(pl.mod.open)
		if err != nil {
			return fail(err)
		}
		err = in.attachCalls(p, f, pl.mod, pl.calls, site, ret)
		f.Close()
		if err != nil {
			return fail(err)
		}
	}
	ex, err := link.OpenExecutable(in.ELFPath)
	if err != nil {
		return fail(err)
	}
	if cn, err := in.contextNewSpec(); err == nil {
		if ls, err := probesite.Attach(ex, ret, in.PID, true, []probesite.Spec{cn}); err == nil {
			p.links = append(p.links, ls...)
		}
	}
	return p, nil
}

// attachCalls attaches site after every call of c in module m, and ret on
// the return of every wrapper: one link for each (probesite.Attach).
func (in *Interpreter) attachCalls(p *Probes, f *elf.File, m copyModule, c *probesite.Calls, site, ret *ebpf.Program) error {
	ex, err := link.OpenExecutable(m.open)
	if err != nil {
		return fmt.Errorf("opening %s of process %d for uprobes: %w", m.path, in.PID, err)
	}
	var sites, rets []probesite.Spec
	for _, s := range c.Sites {
		cookie, ok := siteRegs[s.Reg]
		if !ok {
			return fmt.Errorf("%s: the call at %#x leaves the context in %v, which no probe reads", m.path, s.Call, s.Reg)
		}
		if s.Holder {
			cookie |= regTask
		}
		off, err := probesite.FileOffset(f, s.Probe)
		if err != nil {
			return err
		}
		sites = append(sites, probesite.Spec{Address: off, Cookie: cookie})
	}
	for _, w := range c.Returns {
		at, cheap, err := probesite.Entry(f, w)
		if err != nil || !cheap {
			return fmt.Errorf("%s: the wrapper at %#x starts with an instruction the kernel would single-step (err %v)", m.path, w, err)
		}
		off, err := probesite.FileOffset(f, w)
		if err != nil {
			return err
		}
		rets = append(rets, probesite.Spec{Address: off, Offset: at})
	}
	ls, err := probesite.Attach(ex, site, in.PID, false, sites)
	if err != nil {
		return fmt.Errorf("attaching the link probes after the %d calls of %s in %s of process %d: %w",
			len(sites), ProbeSymbol, m.path, in.PID, err)
	}
	p.links = append(p.links, ls...)
	ls, err = probesite.Attach(ex, ret, in.PID, true, rets)
	if err != nil {
		return fmt.Errorf("attaching return probes to the %d wrappers of %s in %s of process %d: %w",
			len(rets), ProbeSymbol, m.path, in.PID, err)
	}
	p.links = append(p.links, ls...)
	return nil
}

// siteProbesOff: GYMTRACE_PY_SITES=0 keeps the return probe on
// PyContext_CopyCurrent (cost comparisons; a fallback should call-site
// probes misbehave somewhere).
var siteProbesOff = os.Getenv("GYMTRACE_PY_SITES") == "0"

// SiteProbesWanted: call-site probes are tried on this machine (x86-64,
// not switched off).
func SiteProbesWanted() bool { return !siteProbesOff && runtime.GOARCH == "amd64" }
