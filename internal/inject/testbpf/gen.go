// Package testbpf is a test-only BPF object: bpf/gymtrace.c's syscall
// programs plus bpf/inject.h, so internal/inject's tests can prove traceparent
// injection on live sockets without touching the committed object.
package testbpf

//go:generate env BPF2GO_CC=clang-16 BPF2GO_STRIP=llvm-strip-16 go tool bpf2go -tags linux -target amd64 injtest injtest.c -- -I../../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror
