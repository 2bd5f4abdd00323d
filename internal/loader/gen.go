package loader

// The contract types in bpf/common/contract.h are emitted because bpf/gymtrace.c
// declares a variable of each; bpf2go then generates their Go twins.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 bpf ../../bpf/gymtrace.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror
