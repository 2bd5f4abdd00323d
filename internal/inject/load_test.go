//go:build linux

package inject

import (
	"os"
	"testing"

	"github.com/gymtrace/gymtrace/internal/inject/testbpf"
)

func TestVerifierAcceptsTestObject(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loading BPF needs root")
	}
	o, err := testbpf.Load()
	if err != nil {
		t.Fatalf("the kernel refused the injection programs: %v", err)
	}
	o.Close()
}
