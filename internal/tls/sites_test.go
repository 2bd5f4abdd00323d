package tls

import (
	"debug/elf"
	"os"
	"testing"

	"github.com/gymtrace/gymtrace/internal/probesite"
)

const debianLibSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"

func TestFindSitesDebianLibSSL(t *testing.T) {
	if _, err := os.Stat(debianLibSSL); err != nil {
		t.Skip("no Debian libssl.so.3 here")
	}
	s, err := FindSites(debianLibSSL)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read %+v\nwrite %+v\nhandshake %+v\nfree %+v", s.Read, s.Write, s.Handshake, s.Free)
	if s.Static {
		t.Error("libssl.so.3 reported as static OpenSSL")
	}
	// Debian's OpenSSL 3 has the wrapper pattern: one emulated probe on
	// the internal function covers SSL_read and SSL_read_ex.
	for _, site := range []Site{s.Read, s.Write, s.Handshake, s.Free} {
		if !site.Cheap {
			t.Errorf("%s at %#x is single-stepped", site.Symbol, site.Offset)
		}
	}
	if s.Read.Flavor != FlavorEx || s.Write.Flavor != FlavorEx || !s.Write.Write || s.Read.Write {
		t.Errorf("flavors: read %+v write %+v", s.Read, s.Write)
	}
	f, err := elf.Open(debianLibSSL)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The probed instruction of the internal functions is a push.
	for _, site := range []Site{s.Read, s.Write} {
		code := make([]byte, 2)
		if _, err := f.Section(".text").ReadAt(code, int64(site.Offset-f.Section(".text").Offset)); err != nil {
			t.Fatal(err)
		}
		if !probesite.IsEmulated(code) || code[0] == 0xe8 {
			t.Errorf("%s: probed bytes % x, want a push", site.Symbol, code)
		}
	}
}

func TestFindSitesNoOpenSSL(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FindSites(exe); !IsNoOpenSSL(err) {
		t.Errorf("FindSites(test binary) = %v, want no OpenSSL", err)
	}
}

func TestParseMaps(t *testing.T) {
	maps := []byte(`55d0c0a00000-55d0c0a2c000 r--p 00000000 fd:01 1234 /usr/bin/python3.11
55d0c0a2c000-55d0c0d00000 r-xp 0002c000 fd:01 1234 /usr/bin/python3.11
7f0000000000-7f0000020000 r--p 00000000 fd:01 777 /usr/lib/x86_64-linux-gnu/libssl.so.3
7f0000020000-7f0000080000 r-xp 00020000 fd:01 777 /usr/lib/x86_64-linux-gnu/libssl.so.3
7f0000100000-7f0000180000 r-xp 00000000 00:2a 99 /app/my lib/libssl-abc123.so.3 (deleted)
7f0000200000-7f0000201000 r-xp 00000000 00:00 0 [vdso]
7f0000300000-7f0000301000 rw-p 00000000 00:00 0
`)
	got := parseMaps(maps)
	if len(got) != 3 {
		t.Fatalf("%d executable file mappings, want 3: %+v", len(got), got)
	}
	if got[1].start != 0x7f0000020000 || got[1].inode != 777 || got[1].dev != "fd:01" {
		t.Errorf("libssl mapping %+v", got[1])
	}
	if got[2].path != "/app/my lib/libssl-abc123.so.3 (deleted)" || !isLibSSL(got[2].path) {
		t.Errorf("path with a space and (deleted): %+v", got[2])
	}
	p := openPaths("/proc", 42, got[2])
	if p[0] != "/proc/42/map_files/7f0000100000-7f0000180000" || p[1] != "/proc/42/root/app/my lib/libssl-abc123.so.3" {
		t.Errorf("open paths %q", p)
	}
	for path, want := range map[string]bool{
		"/usr/lib/x86_64-linux-gnu/libssl.so.3":    true,
		"/usr/lib/libssl.so.1.1":                   true,
		"/usr/lib/x86_64-linux-gnu/libssl3.so":     true, // NSS's libssl3: no SSL_read, FindSites says so
		"/usr/lib/x86_64-linux-gnu/libcrypto.so.3": false,
		"/usr/bin/python3.11":                      false,
	} {
		if isLibSSL(path) != want {
			t.Errorf("isLibSSL(%s) = %v", path, !want)
		}
	}
}
