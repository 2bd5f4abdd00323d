package groups

import (
	"fmt"
	"os"
	"testing"
)

// The userspace gate is Mask.Has; Gym's overhead test compares its gate with
// a bare function call, and so does this file.

var (
	sinkBool bool
	sinkMask = DefaultMask // a variable, so the compiler cannot fold the test
)

//go:noinline
func bareCall() bool { return false }

func BenchmarkGateDisabled(b *testing.B) {
	m := sinkMask
	for i := 0; i < b.N; i++ {
		sinkBool = m.Has(Sandbox)
	}
}

func BenchmarkGateEnabled(b *testing.B) {
	m := sinkMask
	for i := 0; i < b.N; i++ {
		sinkBool = m.Has(Server)
	}
}

func BenchmarkBareCall(b *testing.B) {
	for i := 0; i < b.N; i++ {
		sinkBool = bareCall()
	}
}

func BenchmarkResolve(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Resolve("Default, sandbox"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGateOverhead prints the disabled-gate cost next to a bare call and,
// like Gym's test, requires the gate to cost less than 4x the call.
func TestGateOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test; skipped with -short")
	}
	gate := testing.Benchmark(BenchmarkGateDisabled)
	call := testing.Benchmark(BenchmarkBareCall)
	gns := float64(gate.T.Nanoseconds()) / float64(gate.N)
	cns := float64(call.T.Nanoseconds()) / float64(call.N)
	fmt.Fprintf(os.Stdout, "span-group gate (disabled): %.3f ns/op   bare function call: %.3f ns/op\n", gns, cns)
	if gns >= 4*cns {
		t.Errorf("gate %.3f ns is not below 4x a bare call (%.3f ns)", gns, cns)
	}
}
