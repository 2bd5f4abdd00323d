package python

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// uvloop support: where its transports' write methods are, in a stripped
// extension module.
//
// uvloop 0.17-0.22 defers small writes: UVStream.write only appends the
// buffer, and the loop's check handle flushes it later, in no task's context
// (docs/python-causality.md). The syscall then cannot name the writing task,
// so a probe on the write method itself does (bpf/python_uvloop.h): there the
// GIL is held and tstate->context is the task's. It keys the buffer's data
// address, which is exactly what the flush hands to write(2)/writev(2)
// (PyBytes_AS_STRING for bytes, the buffer of a memoryview otherwise).
//
// UVStream.write and .writelines are methods of a Cython extension type, so
// even a stripped module keeps their PyMethodDef entries: the type object's
// tp_name points at "uvloop.loop.UVStream" and its tp_methods at an array of
// {name, function, flags, doc}. In a shared object those pointers are
// R_*_RELATIVE relocations whose addends are the targets, so the file alone
// gives the functions' addresses.

// UVloopSite is one probed method.
type UVloopSite struct {
	Name   string // "write" or "writelines"
	Vaddr  uint64 // the function's address in the module (ELF virtual address)
	Offset uint64 // bytes from Vaddr to the probed instruction (past endbr64)
	Flags  uint32 // PyMethodDef.ml_flags (METH_O, or METH_FASTCALL|METH_KEYWORDS)
	Cheap  bool   // the probed instruction is one the kernel emulates
	// FileOff is Vaddr as a file offset, which uprobes take.
	FileOff uint64
}

// UVloopModule is a uvloop extension module mapped by a process.
type UVloopModule struct {
	Path    string // as mapped (/proc/PID/maps)
	ELFPath string // a path that opens it from here (map_files or root)
	Version string // uvloop's version, from its _version.py; "" unknown
	Sites   []UVloopSite
}

// CPython method flags (methodobject.h).
const (
	methVarargs  = 0x1
	methKeywords = 0x2
	methO        = 0x8
	methFastcall = 0x80
	methMethod   = 0x200
)

// Calling conventions the write probe understands (the attach cookie).
const (
	// UVConvO: METH_O, the buffer is the second argument.
	UVConvO = 1
	// UVConvFastcall: METH_FASTCALL[|METH_KEYWORDS], args[0] is the buffer.
	UVConvFastcall = 2
	// UVWriteLines: the argument is a sequence of buffers; the first counts.
	UVWriteLines = 1 << 8
)

// Cookie is the value the write probe gets from bpf_get_attach_cookie. A
// convention bpf/python_uvloop.h does not read is an error, so such a build
// is reported as not recognised instead of probed for nothing.
func (s UVloopSite) Cookie() (uint64, error) {
	var c uint64
	switch {
	case s.Flags&methMethod != 0:
		// METH_METHOD (Cython cpdef: self, defining class, args, ...):
		// the buffer is in another register.
		return 0, fmt.Errorf("UVStream.%s has calling convention %#x (METH_METHOD), which the probe does not read", s.Name, s.Flags)
	case s.Flags&methFastcall != 0:
		c = UVConvFastcall
	case s.Flags&methO != 0:
		c = UVConvO
	default:
		return 0, fmt.Errorf("UVStream.%s has calling convention %#x, which the probe does not read", s.Name, s.Flags)
	}
	if s.Name == "writelines" {
		c |= UVWriteLines
	}
	return c, nil
}

var uvloopModRe = regexp.MustCompile(`/uvloop/loop\.[^/]*\.so$`)

// IsUVloopModule reports whether a mapped path is uvloop's loop extension.
func IsUVloopModule(path string) bool { return uvloopModRe.MatchString(path) }

// FindUVloop returns the uvloop module process pid has mapped, or nil when
// it has none (the process runs the default loop, or has not imported uvloop
// yet). For a build that defers writes it also finds the write methods; an
// error then comes with the module, which the probes cannot be attached to.
func FindUVloop(pid int) (*UVloopModule, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !IsUVloopModule(f[5]) {
			continue
		}
		path := f[5]
		open := fmt.Sprintf("/proc/%d/map_files/%s", pid, f[0])
		if _, err := os.Stat(open); err != nil {
			open = filepath.Join(fmt.Sprintf("/proc/%d/root", pid), path)
		}
		m := &UVloopModule{Path: path, ELFPath: open, Version: uvloopVersion(fmt.Sprintf("/proc/%d/root", pid), path)}
		if !m.Deferred() {
			return m, nil // writes run in the writing task: nothing to probe
		}
		found, err := InspectUVloop(open)
		if err != nil {
			return m, fmt.Errorf("uvloop %s (%s) of process %d: %w", m.Version, path, pid, err)
		}
		m.Sites = found.Sites
		return m, nil
	}
	return nil, nil
}

var versionRe = regexp.MustCompile(`__version__\s*=\s*['"]([^'"]+)['"]`)

// uvloopVersion reads __version__ from the _version.py beside the module.
// /proc/PID/maps shows paths as the reader's root sees them, so the mapped
// path is tried as it is first, then inside the process's root (a path the
// process saw before a pivot_root or in a container whose files are not
// reachable from here otherwise).
func uvloopVersion(root, modPath string) string {
	rel := filepath.Join(filepath.Dir(modPath), "_version.py")
	for _, p := range []string{rel, filepath.Join(root, rel)} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if m := versionRe.FindSubmatch(b); m != nil {
			return string(m[1])
		}
	}
	return ""
}

// ErrNoUVStream: the module is not a uvloop build whose UVStream methods
// this package can find.
var ErrNoUVStream = errors.New("UVStream's write methods not found")

// InspectUVloop finds UVStream.write and .writelines in a uvloop module.
func InspectUVloop(path string) (*UVloopModule, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := &UVloopModule{ELFPath: path}
	var relType uint32
	switch f.Machine {
	case elf.EM_X86_64:
		relType = uint32(elf.R_X86_64_RELATIVE)
	case elf.EM_AARCH64:
		relType = uint32(elf.R_AARCH64_RELATIVE)
	default:
		return nil, fmt.Errorf("%v: unsupported machine", f.Machine)
	}
	rel, err := relativeRelocs(f, relType)
	if err != nil {
		return nil, err
	}
	name, ok := findCString(f, "uvloop.loop.UVStream")
	if !ok {
		return nil, fmt.Errorf("%w: no \"uvloop.loop.UVStream\" string", ErrNoUVStream)
	}
	// Every pointer to the name: the type object's tp_name is one of them.
	var methods uint64
	for off, add := range rel {
		if add != name {
			continue
		}
		const tpName, tpMethods = 24, 232 // offsetof(PyTypeObject, ...) on 64-bit
		if mt, ok := rel[off-tpName+tpMethods]; ok {
			methods = mt
			break
		}
	}
	if methods == 0 {
		return nil, fmt.Errorf("%w: no type object names uvloop.loop.UVStream", ErrNoUVStream)
	}
	// PyMethodDef: {const char *ml_name; void *ml_meth; int ml_flags; const char *ml_doc}.
	for i := uint64(0); i < 256; i++ {
		e := methods + 32*i
		nameAt, ok := rel[e]
		if !ok {
			break // the {NULL} sentinel
		}
		n, err := readCString(f, nameAt, 64)
		if err != nil {
			return nil, err
		}
		if n != "write" && n != "writelines" {
			continue
		}
		fn, ok := rel[e+8]
		if !ok {
			return nil, fmt.Errorf("UVStream.%s has no function pointer", n)
		}
		fl, err := probesite.ReadVaddr(f, e+16, 4)
		if err == nil && len(fl) < 4 {
			err = fmt.Errorf("UVStream.%s's method entry at %#x is cut off", n, e)
		}
		if err != nil {
			return nil, err
		}
		s := UVloopSite{Name: n, Vaddr: fn, Flags: f.ByteOrder.Uint32(fl)}
		s.Offset, s.Cheap, err = probesite.Entry(f, fn)
		if err != nil {
			return nil, err
		}
		if s.FileOff, err = probesite.FileOffset(f, fn); err != nil {
			return nil, err
		}
		m.Sites = append(m.Sites, s)
	}
	names := map[string]bool{}
	for _, s := range m.Sites {
		names[s.Name] = true
	}
	if !names["write"] || !names["writelines"] {
		// uvloop > 0.22 makes write a cpdef, which is not in the table.
		return nil, fmt.Errorf("%w: UVStream's method table lacks write or writelines (found %d of 2)",
			ErrNoUVStream, len(names))
	}
	return m, nil
}

// relativeRelocs maps each R_*_RELATIVE relocation's target to its addend.
func relativeRelocs(f *elf.File, typ uint32) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA {
			continue
		}
		b, err := s.Data()
		if err != nil {
			return nil, err
		}
		for i := 0; i+24 <= len(b); i += 24 {
			info := binary.LittleEndian.Uint64(b[i+8:])
			if uint32(info) != typ {
				continue
			}
			out[binary.LittleEndian.Uint64(b[i:])] = binary.LittleEndian.Uint64(b[i+16:])
		}
	}
	return out, nil
}

// findCString returns the address of a NUL-terminated s in an allocated,
// non-writable section.
func findCString(f *elf.File, s string) (uint64, bool) {
	want := append([]byte(s), 0)
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_ALLOC == 0 || sec.Flags&elf.SHF_WRITE != 0 {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			continue
		}
		for at := 0; ; {
			i := bytes.Index(b[at:], want)
			if i < 0 {
				break
			}
			p := at + i
			if p == 0 || b[p-1] == 0 { // the whole string, not a tail
				return sec.Addr + uint64(p), true
			}
			at = p + 1
		}
	}
	return 0, false
}

func readCString(f *elf.File, vaddr uint64, max int) (string, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || vaddr < p.Vaddr || vaddr >= p.Vaddr+p.Filesz {
			continue
		}
		n := max
		if rest := p.Vaddr + p.Filesz - vaddr; uint64(n) > rest {
			n = int(rest)
		}
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(vaddr-p.Vaddr)); err != nil {
			return "", err
		}
		if i := bytes.IndexByte(b, 0); i >= 0 {
			return string(b[:i]), nil
		}
		return string(b), nil
	}
	return "", fmt.Errorf("address %#x is in no loaded segment", vaddr)
}

// deferredWrites: uvloop up to 0.22.1 buffers small writes until the loop's
// check phase; later releases write at once when libuv's queue is empty
// (uvloop #619), so the syscall runs in the writing task, as on the default
// loop. An unknown version is taken as deferring (the probes then do no harm:
// an immediate write finds its own task's record).
func deferredWrites(version string) bool {
	var a, b, c int
	if n, _ := fmt.Sscanf(version, "%d.%d.%d", &a, &b, &c); n < 2 {
		return true
	}
	return a == 0 && (b < 22 || (b == 22 && c <= 1))
}

// Deferred reports whether this build defers small writes (see deferredWrites).
func (m *UVloopModule) Deferred() bool { return deferredWrites(m.Version) }

// AttachWriteProbes attaches prog (gt_py_uv_write, bpf/python_uvloop.h) to
// UVStream.write and .writelines of this module in process pid only. Every
// site must be usable: with one of them missing, writes through it would
// keep the loop's context and their calls would be wrongly unattributed
// while the others are not, so it is all or nothing.
func (m *UVloopModule) AttachWriteProbes(pid int, prog *ebpf.Program) (io.Closer, error) {
	if prog == nil {
		return nil, errors.New("attaching uvloop write probes: no gt_py_uv_write program")
	}
	ex, err := link.OpenExecutable(m.ELFPath)
	if err != nil {
		return nil, fmt.Errorf("opening %s of process %d for uprobes: %w", m.Path, pid, err)
	}
	var specs []probesite.Spec
	for _, s := range m.Sites {
		cookie, err := s.Cookie()
		if err != nil {
			return nil, err
		}
		if !s.Cheap {
			return nil, fmt.Errorf("UVStream.%s in %s starts with an instruction the kernel would single-step "+
				"(about 20 µs a write); not probing it", s.Name, m.Path)
		}
		specs = append(specs, probesite.Spec{Address: s.FileOff, Offset: s.Offset, Cookie: cookie})
	}
	ls, err := probesite.Attach(ex, prog, pid, false, specs)
	if err != nil {
		return nil, fmt.Errorf("attaching uprobes to UVStream's write methods in %s of process %d: %w", m.Path, pid, err)
	}
	return &Probes{links: ls}, nil
}
