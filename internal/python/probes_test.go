package python

import (
	"os"
	"path/filepath"
	"testing"
)

// The probe must land on an instruction the kernel emulates: Debian 12's
// python3.11 starts PyContext_CopyCurrent with push %rsi, Debian 13's
// python3.13 with endbr64 then push %rbx, sid's python3.14 with endbr64,
// two loads and a test before a je, python-build-standalone's 3.14 with
// push %rbp.
func TestProbeOffset(t *testing.T) {
	for _, c := range []struct {
		path string
		off  uint64
	}{
		{"/usr/bin/python3.11", 0},
		{filepath.Join(trixieRoot, trixiePython), 4},
		{filepath.Join(sidRoot, sidPython), 0x17},
		// python-build-standalone: frame pointers, no CET.
		{filepath.Join(sidRoot, pbsPython), 0},
	} {
		if _, err := os.Stat(c.path); err != nil {
			t.Logf("skipping %s: %v", c.path, err)
			continue
		}
		off, cheap, err := probeOffset(c.path, ProbeSymbol)
		if err != nil {
			t.Fatal(err)
		}
		if off != c.off || !cheap {
			t.Errorf("%s: probe offset %d (emulated=%v), want %#x, emulated", c.path, off, cheap, c.off)
		}
	}
}
