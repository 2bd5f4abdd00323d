package python

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Symbols every supported CPython exports in .dynsym.
const (
	symRuntime     = "_PyRuntime"
	symContextType = "PyContext_Type"
	symVersion     = "Py_Version" // 3.11+
	// ProbeSymbol is the function whose return the link probe
	// (gt_py_copy_ret) watches.
	ProbeSymbol = "PyContext_CopyCurrent"
)

// The buffer and sequence types the uvloop write probe recognises, by their
// exported type objects, then PyLong_Type (a 3.14 Task's name counter,
// gt_py_task_serial).
var typeSymbols = []string{"PyBytes_Type", "PyByteArray_Type", "PyMemoryView_Type", "PyList_Type", "PyTuple_Type", "PyLong_Type"}

// ErrNotPython means the process maps no ELF that defines _PyRuntime.
var ErrNotPython = errors.New("no CPython runtime in the process")

// ErrNotReady means the interpreter is found but its runtime is not yet (or
// no longer) initialised, e.g. right after exec: inspect again later.
var ErrNotReady = errors.New("CPython runtime not initialised yet")

// Interpreter describes the CPython runtime inside one process.
type Interpreter struct {
	PID     int
	Version Version
	// ELFPath opens the ELF that defines _PyRuntime from this (the tracer's)
	// mount namespace: /proc/PID/map_files/... or /proc/PID/root/<path>.
	ELFPath string
	// MappedPath is that ELF's path as /proc/PID/maps shows it (the
	// executable, or a libpython shared object).
	MappedPath string
	Shared     bool   // the runtime lives in a shared libpython
	Bias       uint64 // load bias: runtime address = ELF symbol value + Bias
	Params     Params
}

// Inspect returns the gt_py_procs value for pid. See InspectInterpreter.
func Inspect(pid int) (Params, error) {
	in, err := InspectInterpreter(pid)
	if err != nil {
		return Params{}, err
	}
	return in.Params, nil
}

// InspectInterpreter finds the CPython runtime of pid and the layout the
// kernel needs, then proves it on the live process by walking its thread
// list (Walk) and finding at least one of its threads. Errors wrap
// ErrNotPython or ErrNotReady when that is the reason.
func InspectInterpreter(pid int) (*Interpreter, error) {
	maps, err := readMaps(pid)
	if err != nil {
		return nil, err
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	in, syms, err := findRuntime(pid, maps, exe)
	if err != nil {
		return nil, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, fmt.Errorf("opening the memory of process %d (needs root or CAP_SYS_PTRACE): %w", pid, err)
	}
	defer mem.Close()

	in.Params.Runtime = syms[symRuntime] + in.Bias
	in.Params.ContextType = syms[symContextType] + in.Bias
	for i, dst := range []*uint64{&in.Params.BytesType, &in.Params.ByteArrayType, &in.Params.MemoryViewType,
		&in.Params.ListType, &in.Params.TupleType, &in.Params.LongType} {
		if a, ok := syms[typeSymbols[i]]; ok {
			*dst = a + in.Bias
		}
	}
	if addr, ok := syms[symVersion]; ok {
		var b [4]byte
		if _, err := mem.ReadAt(b[:], int64(addr+in.Bias)); err != nil {
			return nil, fmt.Errorf("reading Py_Version of process %d: %w", pid, err)
		}
		in.Version = versionFromHex(binary.LittleEndian.Uint32(b[:]))
	} else if v, ok := versionFromName(in.MappedPath); ok {
		in.Version = v
	} else {
		return nil, fmt.Errorf("process %d: %s exports no Py_Version and its name has no version; "+
			"CPython older than 3.11 is not supported", pid, in.MappedPath)
	}

	var head []byte
	if in.Version.Minor >= 13 {
		head = make([]byte, debugHeaderBytes)
		if _, err := mem.ReadAt(head, int64(in.Params.Runtime)); err != nil {
			return nil, fmt.Errorf("reading _PyRuntime of process %d: %w", pid, err)
		}
	}
	l, err := layoutFor(in.Version, head)
	if err != nil {
		return nil, fmt.Errorf("process %d (%s): %w", pid, in.MappedPath, err)
	}
	if l.obType >= 32 || l.ctxPrev >= 32 || l.obType%8 != 0 || l.ctxPrev%8 != 0 {
		// bpf/python.h reads both from one 32-byte window.
		return nil, fmt.Errorf("process %d: PyContext layout (ob_type %d, ctx_prev %d) is outside the "+
			"32 bytes the kernel reads", pid, l.obType, l.ctxPrev)
	}
	in.Params.Version = in.Version.Hex
	in.Params.RuntimeInterpHead = l.runtimeInterpHead
	in.Params.InterpNext = l.interpNext
	in.Params.InterpThreadsHead = l.interpThreadsHead
	in.Params.TstateNext = l.tstateNext
	in.Params.TstateNativeTid = l.tstateNativeTid
	in.Params.TstateContext = l.tstateContext
	// uint64_t context_ver follows PyObject *context in PyThreadState in
	// every supported version (3.11-3.14 headers).
	in.Params.TstateContextVer = l.tstateContext + 8
	in.Params.CtxPrev = l.ctxPrev
	in.Params.ObType = l.obType
	if in.Params.PidnsDev, in.Params.PidnsIno, err = pidNamespace(pid); err != nil {
		return nil, err
	}
	if err := verify(pid, mem, in.Params); err != nil {
		return nil, fmt.Errorf("process %d (CPython %s, %s): %w", pid, in.Version, in.MappedPath, err)
	}
	return in, nil
}

// verify walks the live thread list with the layout and requires that it
// names real threads of the process and that every non-NULL context is a
// PyContext: a wrong table entry fails here, not silently in the kernel.
func verify(pid int, mem *os.File, p Params) error {
	threads, err := walk(mem, p)
	if err != nil {
		return err
	}
	if len(threads) == 0 {
		return ErrNotReady
	}
	tids, err := nsThreadIDs(pid)
	if err != nil {
		return err
	}
	found := 0
	for _, t := range threads {
		if t.Context != 0 && !t.ContextOK {
			return fmt.Errorf("thread state %#x: context %#x is not a PyContext; "+
				"the PyThreadState.context offset %d is wrong for this build", t.TState, t.Context, p.TstateContext)
		}
		if tids[t.NativeTID] {
			found++
		}
	}
	if found == 0 {
		return fmt.Errorf("none of the %d thread states has the id of a thread of the process "+
			"(native_thread_id offset %d wrong for this build?)", len(threads), p.TstateNativeTid)
	}
	return nil
}

type mapping struct {
	start, end, offset uint64
	perms              string
	dev                string
	inode              uint64
	path               string
}

func readMaps(pid int) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("reading memory map of process %d: %w", pid, err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") {
			continue
		}
		var m mapping
		se := strings.SplitN(fields[0], "-", 2)
		if len(se) != 2 {
			continue
		}
		m.start, _ = strconv.ParseUint(se[0], 16, 64)
		m.end, _ = strconv.ParseUint(se[1], 16, 64)
		m.perms = fields[1]
		m.offset, _ = strconv.ParseUint(fields[2], 16, 64)
		m.dev = fields[3]
		m.inode, _ = strconv.ParseUint(fields[4], 10, 64)
		m.path = strings.Join(fields[5:], " ")
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading memory map of process %d: %w", pid, err)
	}
	return out, nil
}

var libpythonRE = regexp.MustCompile(`(^|/)libpython3\.\d+[a-z]*\.so`)

// findRuntime looks for _PyRuntime in the executable first, then in mapped
// files named like libpython3.X*.so* (shared builds) or python* (embedders).
func findRuntime(pid int, maps []mapping, exe string) (*Interpreter, map[string]uint64, error) {
	type file struct {
		dev   string
		inode uint64
	}
	seen := map[file]bool{}
	var order []mapping
	add := func(pred func(m mapping) bool) {
		for _, m := range maps {
			k := file{m.dev, m.inode}
			if !seen[k] && pred(m) {
				seen[k] = true
				order = append(order, m)
			}
		}
	}
	add(func(m mapping) bool { return m.path == exe })
	add(func(m mapping) bool { return libpythonRE.MatchString(m.path) })
	add(func(m mapping) bool { return strings.Contains(filepath.Base(m.path), "python") })

	var errs []error
	for _, m := range order {
		in, syms, err := tryELF(pid, maps, m)
		if err == nil {
			return in, syms, nil
		}
		if !errors.Is(err, ErrNotPython) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(append([]error{fmt.Errorf("process %d: %w", pid, ErrNotPython)}, errs...)...)
	}
	return nil, nil, fmt.Errorf("process %d (%s): %w", pid, exe, ErrNotPython)
}

// mappedPaths are the paths that open m's file from here, best first:
// map_files names the very file mapped, even across mount namespaces or
// after the file was replaced on disk; root+path is the fallback.
func mappedPaths(pid int, m mapping) []string {
	return []string{
		fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.start, m.end),
		fmt.Sprintf("/proc/%d/root%s", pid, m.path),
	}
}

func tryELF(pid int, maps []mapping, m mapping) (*Interpreter, map[string]uint64, error) {
	var f *elf.File
	var path string
	var err error
	for _, p := range mappedPaths(pid, m) {
		if f, err = elf.Open(p); err == nil {
			path = p
			break
		}
	}
	if f == nil {
		return nil, nil, fmt.Errorf("opening %s of process %d: %w", m.path, pid, err)
	}
	defer f.Close()

	want := map[string]bool{symRuntime: true, symContextType: true, symVersion: true, ProbeSymbol: true}
	for _, n := range typeSymbols {
		want[n] = true
	}
	syms := map[string]uint64{}
	collect := func(list []elf.Symbol) {
		for _, s := range list {
			if want[s.Name] && s.Value != 0 && s.Section != elf.SHN_UNDEF {
				syms[s.Name] = s.Value
			}
		}
	}
	if ds, err := f.DynamicSymbols(); err == nil {
		collect(ds)
	}
	if _, ok := syms[symRuntime]; !ok {
		if ss, err := f.Symbols(); err == nil { // unstripped static embedders
			collect(ss)
		}
	}
	if _, ok := syms[symRuntime]; !ok {
		return nil, nil, ErrNotPython
	}
	if _, ok := syms[symContextType]; !ok {
		return nil, nil, fmt.Errorf("%s defines %s but not %s", m.path, symRuntime, symContextType)
	}
	bias, err := loadBias(f, maps, m)
	if err != nil {
		return nil, nil, fmt.Errorf("%s in process %d: %w", m.path, pid, err)
	}
	return &Interpreter{
		PID:        pid,
		ELFPath:    path,
		MappedPath: m.path,
		Shared:     f.Type == elf.ET_DYN && libpythonRE.MatchString(m.path),
		Bias:       bias,
	}, syms, nil
}

// loadBias: a mapping of file offset off at address start holds the segment
// whose file range contains off, so bias = start - (p_vaddr - p_offset + off).
func loadBias(f *elf.File, maps []mapping, m mapping) (uint64, error) {
	for _, mm := range maps {
		if mm.dev != m.dev || mm.inode != m.inode {
			continue
		}
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD {
				continue
			}
			pageOff := p.Off &^ 0xfff
			if mm.offset >= pageOff && mm.offset < p.Off+p.Filesz {
				return mm.start - (p.Vaddr - p.Off + mm.offset), nil
			}
		}
	}
	return 0, errors.New("no mapping matches a PT_LOAD segment; cannot compute the load bias")
}

var versionNameRE = regexp.MustCompile(`python(\d)\.(\d+)`)

func versionFromName(path string) (Version, bool) {
	m := versionNameRE.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return Version{}, false
	}
	maj, _ := strconv.Atoi(m[1])
	mnr, _ := strconv.Atoi(m[2])
	return Version{Major: maj, Minor: mnr, Hex: uint32(maj)<<24 | uint32(mnr)<<16}, true
}

// pidNamespace returns the nsfs (dev, inode) of pid's PID namespace, or
// zeros when it is the initial one (then native thread ids are global ids
// and the kernel skips bpf_get_ns_current_pid_tgid). The initial namespace
// is recognised as the tracer's own when the tracer has a single NSpid
// (/proc/1 may be unreadable even to root in a sandbox).
func pidNamespace(pid int) (uint64, uint64, error) {
	var target, self syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &target); err != nil {
		return 0, 0, fmt.Errorf("reading PID namespace of process %d: %w", pid, err)
	}
	if err := syscall.Stat("/proc/self/ns/pid", &self); err != nil {
		return 0, 0, fmt.Errorf("reading the tracer's PID namespace: %w", err)
	}
	if target.Dev == self.Dev && target.Ino == self.Ino && selfInInitialPIDNS() {
		return 0, 0, nil
	}
	return target.Dev, target.Ino, nil
}

func selfInInitialPIDNS() bool {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(st), "\n") {
		if strings.HasPrefix(line, "NSpid:") {
			return len(strings.Fields(strings.TrimPrefix(line, "NSpid:"))) == 1
		}
	}
	return true // kernels before 4.1 have no NSpid and no nested view here
}

// nsThreadIDs returns the ids of pid's threads in its own PID namespace (the
// last NSpid value of each task's status), as native_thread_id holds them.
func nsThreadIDs(pid int) (map[uint64]bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing threads of process %d: %w", pid, err)
	}
	out := make(map[uint64]bool, len(ents))
	for _, e := range ents {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		out[id] = true
		st, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(strings.TrimPrefix(line, "NSpid:")); strings.HasPrefix(line, "NSpid:") && len(f) > 1 {
				if ns, err := strconv.ParseUint(f[len(f)-1], 10, 64); err == nil {
					out[ns] = true
				}
			}
		}
	}
	return out, nil
}
