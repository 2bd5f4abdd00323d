package python

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDeferredWrites(t *testing.T) {
	for v, want := range map[string]bool{
		"0.17.0": true, "0.21.0": true, "0.22.1": true, "0.22.2": false, "0.23.0": false, "1.0.0": false, "": true, "dev": true,
	} {
		if got := deferredWrites(v); got != want {
			t.Errorf("deferredWrites(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestSiteCookie(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags uint32
		want  uint64
	}{
		{"write", methO, UVConvO},
		{"writelines", methO, UVConvO | UVWriteLines},
		{"write", methFastcall | methKeywords, UVConvFastcall},
	} {
		got, err := UVloopSite{Name: c.name, Flags: c.flags}.Cookie()
		if err != nil || got != c.want {
			t.Errorf("%s flags %#x: cookie %#x, %v; want %#x", c.name, c.flags, got, err, c.want)
		}
	}
	for _, fl := range []uint32{methVarargs, methMethod | methFastcall | methKeywords} {
		if _, err := (UVloopSite{Name: "write", Flags: fl}).Cookie(); err == nil {
			t.Errorf("flags %#x: want an error, the probe does not read that convention", fl)
		}
	}
}

// The uvloop builds this machine has: Debian 12's 0.17 (METH_O), Debian 13's
// 0.21 (Cython 3, METH_FASTCALL, CET), and sid's 0.23, whose write is a
// cpdef and which writes at once (no probe needed).
func TestInspectUVloop(t *testing.T) {
	cases := []struct {
		root, glob string
		conv       uint64
		deferred   bool
	}{
		{"/", "usr/lib/python3/dist-packages/uvloop/loop.cpython-311-*.so", UVConvO, true},
		{trixieRoot, "usr/lib/python3/dist-packages/uvloop/loop.cpython-313-*.so", UVConvFastcall, true},
		{"/var/tmp/gymtrace-sid", "usr/lib/python3/dist-packages/uvloop/loop.cpython-314-*.so", 0, false},
	}
	ran := 0
	for _, c := range cases {
		paths, _ := filepath.Glob(filepath.Join(c.root, c.glob))
		if len(paths) == 0 {
			t.Logf("no %s under %s: skipped (scripts/setup installs python3-uvloop and makes the Debian roots)", c.glob, c.root)
			continue
		}
		ran++
		p := paths[0]
		ver := uvloopVersion("/nonexistent", p) // maps shows the path as this process sees it
		if got := deferredWrites(ver); got != c.deferred {
			t.Errorf("%s: uvloop %q deferred = %v, want %v", p, ver, got, c.deferred)
		}
		m, err := InspectUVloop(p)
		if !c.deferred {
			// 0.23's UVStream.write is a cpdef: not in the method table,
			// and this build is not probed (it writes at once).
			if !errors.Is(err, ErrNoUVStream) {
				t.Errorf("%s: %v, %v; want ErrNoUVStream (write is a cpdef there)", p, m, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		names := map[string]bool{}
		for _, s := range m.Sites {
			names[s.Name] = true
			ck, err := s.Cookie()
			if err != nil || ck&0xff != c.conv {
				t.Errorf("%s: %s cookie %#x, %v; want convention %d", p, s.Name, ck, err, c.conv)
			}
			if !s.Cheap {
				t.Errorf("%s: %s probed at +%d, an instruction the kernel single-steps", p, s.Name, s.Offset)
			}
			if s.FileOff == 0 || s.FileOff > s.Vaddr {
				t.Errorf("%s: %s: file offset %#x for address %#x", p, s.Name, s.FileOff, s.Vaddr)
			}
		}
		if !names["write"] || !names["writelines"] {
			t.Errorf("%s: found %v, want write and writelines", p, names)
		}
	}
	if ran == 0 {
		t.Skip("no uvloop module on this machine")
	}
}

func TestInspectUVloopNotUVloop(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := InspectUVloop(exe); !errors.Is(err, ErrNoUVStream) {
		t.Errorf("the test binary: %v, want ErrNoUVStream", err)
	}
}
