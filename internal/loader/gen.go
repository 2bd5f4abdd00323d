package loader

// The contract types in bpf/common/contract.h are emitted because bpf/gymtrace.c
// declares a variable of each; bpf2go then generates their Go twins.
//
// Two objects from the one source (variant.go picks one at load): bpf, with
// open-coded iterators (Linux 6.4+), and bpfbounded, with plain bounded loops
// for kernels without the iterator kfuncs (-DGT_BOUNDED_LOOPS,
// bpf/common/iter.h) and no section timers (-DGT_NO_PROF_TIME, bpf/common/util.h).
// A third, bpfk510, for Linux 5.10 (no bpf_loop, no global functions with
// pointer arguments): the bounded build's flags and -DGT_K510 (bpf/common/k510.h).
//go:generate go tool bpf2go -tags linux -target amd64,arm64 bpf ../../bpf/gymtrace.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -no-global-types bpfbounded ../../bpf/gymtrace.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror -DGT_BOUNDED_LOOPS -DGT_NO_PROF_TIME
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -no-global-types bpfk510 ../../bpf/gymtrace.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -Wno-unused-variable -O2 -g -Wall -Werror -Wno-unused-function -DGT_BOUNDED_LOOPS -DGT_NO_PROF_TIME -DGT_K510
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -no-global-types probepin ../../bpf/probe_pin.c -- -I../../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
