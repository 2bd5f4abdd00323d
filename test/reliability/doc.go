//go:build linux

// Package reliability holds gymtrace's fault, overload and least-privilege
// tests (issue 10): the real binary under a ring-buffer overload, a collector
// outage and a slow collector, targets that crash, restart, fork and reuse
// PIDs, SIGKILL of the agent itself, dropped capabilities, secrets, and bad
// input on its own command line. Every test loads BPF programs, so they need
// root; without it each one skips and says why.
//
//	sudo go test ./test/reliability/ -v -count=1
//
// CI runs short versions (the package takes a few minutes). scripts/soak runs
// the full-length ones (a 60 s outage, a 60 s burst) by setting
// GYMTRACE_SOAK=1.
package reliability
