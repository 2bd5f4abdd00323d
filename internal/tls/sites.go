package tls

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

// Flavor is how a probed function reports the bytes it moved; the kernel
// program learns it from the attach cookie.
type Flavor uint64

const (
	// FlavorEx: int f(SSL *s, void *buf, size_t num, size_t *done), 1 on
	// success with the count in *done (SSL_read_ex, SSL_write_ex and
	// OpenSSL's internal ssl_read_internal/ssl_write_internal).
	FlavorEx Flavor = 1
	// FlavorInt: int f(SSL *s, void *buf, int num), the count as the
	// return value (SSL_read, SSL_write).
	FlavorInt Flavor = 2

	cookieWrite = 1 << 8 // the probe is on a write function
)

// Site is one probe placement in an ELF file.
type Site struct {
	Symbol string // what the site belongs to ("SSL_read_ex", or "ssl_read_internal via SSL_read_ex")
	Offset uint64 // file offset of the probed instruction
	Flavor Flavor
	Write  bool
	// Cheap reports that the probed instruction is one x86-64 uprobes
	// emulate (push, call, jmp, jcc). Anything else is single-stepped, which
	// costs about 15x more a hit on this kind of machine (docs/tls.md).
	Cheap bool
	// Return: the site also needs a return probe (reads and writes both
	// report their count only on return).
}

// Sites is what one file needs probed.
type Sites struct {
	Path      string
	Read      Site // entry + return
	Write     Site // entry + return
	Handshake Site // entry: links a new SSL* to its socket
	Free      Site // entry: drops the SSL*'s state
	Static    bool // OpenSSL is linked into an executable, not a libssl
}

var errNoOpenSSL = errors.New("no OpenSSL SSL_read/SSL_write symbols")

// elfSym is a defined function symbol: its virtual address and size.
type elfSym struct {
	vaddr, size uint64
}

// FindSites reads path's symbol tables (.dynsym, then .symtab) and picks a
// probe site for each function gymtrace needs. errNoOpenSSL (tested with
// IsNoOpenSSL) when the file has no OpenSSL.
func FindSites(path string) (*Sites, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s as ELF: %w", path, err)
	}
	defer f.Close()
	syms := map[string]elfSym{}
	want := map[string]bool{"SSL_read": true, "SSL_read_ex": true, "SSL_write": true, "SSL_write_ex": true,
		"SSL_do_handshake": true, "SSL_free": true}
	add := func(list []elf.Symbol) {
		for _, s := range list {
			if s.Value == 0 || elf.ST_TYPE(s.Info) != elf.STT_FUNC || !want[s.Name] {
				continue
			}
			if _, ok := syms[s.Name]; !ok {
				syms[s.Name] = elfSym{s.Value, s.Size}
			}
		}
	}
	if d, err := f.DynamicSymbols(); err == nil {
		add(d)
	}
	if len(syms) < len(want) {
		if s, err := f.Symbols(); err == nil {
			add(s)
		}
	}
	_, hasR := syms["SSL_read"]
	_, hasRx := syms["SSL_read_ex"]
	_, hasW := syms["SSL_write"]
	_, hasWx := syms["SSL_write_ex"]
	if !(hasR || hasRx) || !(hasW || hasWx) {
		return nil, errNoOpenSSL
	}
	if _, ok := syms["SSL_do_handshake"]; !ok {
		return nil, fmt.Errorf("%s has SSL_read/SSL_write but no SSL_do_handshake symbol", path)
	}
	s := &Sites{Path: path, Static: f.Type == elf.ET_EXEC || !hasSoname(f)}
	if s.Read, err = rwSite(f, syms, "SSL_read", false); err != nil {
		return nil, err
	}
	if s.Write, err = rwSite(f, syms, "SSL_write", true); err != nil {
		return nil, err
	}
	if s.Handshake, err = entrySite(f, syms, "SSL_do_handshake"); err != nil {
		return nil, err
	}
	if _, ok := syms["SSL_free"]; ok {
		if s.Free, err = entrySite(f, syms, "SSL_free"); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// IsNoOpenSSL reports whether err means the file simply has no OpenSSL.
func IsNoOpenSSL(err error) bool { return errors.Is(err, errNoOpenSSL) }

func hasSoname(f *elf.File) bool {
	n, err := f.DynString(elf.DT_SONAME)
	return err == nil && len(n) > 0
}

// rwSite picks the read (or write) probe. OpenSSL 3 builds SSL_read_ex as
// `sub $8,%rsp; call ssl_read_internal` and SSL_read as a wrapper around the
// same internal function. Its first instruction is a push, which the kernel
// emulates, so one entry+return probe there covers both public functions at
// about a fifteenth of the cost of a probe on SSL_read_ex's `sub`, which must
// be single-stepped. When the pattern is not there (other builds, arm64) the
// public functions are probed at entry.
func rwSite(f *elf.File, syms map[string]elfSym, base string, write bool) (Site, error) {
	exName := base + "_ex"
	ex, hasEx := syms[exName]
	if f.Machine == elf.EM_X86_64 && hasEx {
		if target, ok := wrapperCallTarget(f, ex.vaddr); ok {
			plainOK := true
			if pl, ok := syms[base]; ok {
				plainOK = callsTarget(f, pl, target)
			}
			off, cheap, err := entryOffset(f, target)
			if err == nil && cheap && plainOK {
				return Site{Symbol: "internal of " + exName, Offset: off, Flavor: FlavorEx, Write: write, Cheap: true}, nil
			}
		}
	}
	// Fallback: the public functions themselves. Only one of the two is
	// probed: Python and most clients use the _ex forms (OpenSSL >= 1.1.1),
	// older code the int forms; probing both would double count whenever
	// one calls the other.
	name, fl := exName, FlavorEx
	if !hasEx {
		name, fl = base, FlavorInt
	}
	sym := syms[name]
	off, cheap, err := entryOffset(f, sym.vaddr)
	if err != nil {
		return Site{}, fmt.Errorf("placing a probe on %s: %w", name, err)
	}
	return Site{Symbol: name, Offset: off, Flavor: fl, Write: write, Cheap: cheap}, nil
}

func entrySite(f *elf.File, syms map[string]elfSym, name string) (Site, error) {
	sym := syms[name]
	off, cheap, err := entryOffset(f, sym.vaddr)
	if err != nil {
		return Site{}, fmt.Errorf("placing a probe on %s: %w", name, err)
	}
	// SSL_free starts with `test %rdi,%rdi; je ...` on Debian's build: the
	// je is emulated and %rdi is still the argument there.
	if !cheap && f.Machine == elf.EM_X86_64 {
		base, _ := probesite.FileOffset(f, sym.vaddr)
		code, err := probesite.ReadVaddr(f, sym.vaddr+(off-base), 8)
		if err == nil && len(code) >= 5 && code[0] == 0x48 && code[1] == 0x85 && code[2] == 0xff && probesite.IsEmulated(code[3:]) {
			return Site{Symbol: name, Offset: off + 3, Cheap: true}, nil
		}
	}
	return Site{Symbol: name, Offset: off, Cheap: cheap}, nil
}

// entryOffset is the file offset where a probe on the function at vaddr goes
// (probesite.Entry), and whether the instruction there is emulated.
func entryOffset(f *elf.File, vaddr uint64) (uint64, bool, error) {
	base, err := probesite.FileOffset(f, vaddr)
	if err != nil {
		return 0, false, err
	}
	off, cheap, err := probesite.Entry(f, vaddr)
	return base + off, cheap, err
}

// wrapperCallTarget recognises `[endbr64] sub $imm8,%rsp; call rel32` at
// vaddr: a wrapper that passes its arguments through unchanged (it touches
// only %rsp before the call). Returns the call's target.
func wrapperCallTarget(f *elf.File, vaddr uint64) (uint64, bool) {
	code, err := probesite.ReadVaddr(f, vaddr, 16)
	if err != nil || len(code) < 16 { // a segment's last bytes hold no such wrapper
		return 0, false
	}
	i := 0
	if probesite.IsEndbr64(code) {
		i = 4
	}
	if code[i] != 0x48 || code[i+1] != 0x83 || code[i+2] != 0xec { // sub $imm8,%rsp
		return 0, false
	}
	i += 4
	if code[i] != 0xe8 {
		return 0, false
	}
	rel := int32(binary.LittleEndian.Uint32(code[i+1:]))
	return uint64(int64(vaddr) + int64(i+5) + int64(rel)), true
}

// callsTarget reports whether the function sym contains a `call target`.
func callsTarget(f *elf.File, sym elfSym, target uint64) bool {
	n := sym.size
	if n == 0 || n > 256 {
		n = 256
	}
	code, err := probesite.ReadVaddr(f, sym.vaddr, int(n))
	if err != nil {
		return false
	}
	for i := 0; i+5 <= len(code); i++ {
		if code[i] != 0xe8 {
			continue
		}
		rel := int32(binary.LittleEndian.Uint32(code[i+1:]))
		if uint64(int64(sym.vaddr)+int64(i+5)+int64(rel)) == target {
			return true
		}
	}
	return false
}
