// Package testbpf is a test-only BPF object: the syscall programs of
// bpf/gymtrace.c plus the TLS uprobe programs of bpf/tls.h, so internal/tls's
// tests can prove the kernel side on live processes.
package testbpf

//go:generate env BPF2GO_CC=clang-16 BPF2GO_STRIP=llvm-strip-16 go tool bpf2go -tags linux -target amd64 tlstest tlstest.c -- -I../../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror
