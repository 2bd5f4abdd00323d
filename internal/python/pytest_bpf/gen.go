// Package pytestbpf is a test-only BPF object: bpf/python.h and
// bpf/python_probes.h behind write/sendto/getppid tracepoints, so that
// internal/python's tests prove the kernel side on live interpreters without
// the full bpf/gymtrace.c.
package pytestbpf

//go:generate env BPF2GO_CC=clang-16 BPF2GO_STRIP=llvm-strip-16 go tool bpf2go -tags linux -target amd64 pytest pytest.c -- -I../../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror -Wno-unused-function
