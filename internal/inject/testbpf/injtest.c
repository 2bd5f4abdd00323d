//go:build ignore

// Test object for internal/inject: bpf/gymtrace.c's syscall programs plus
// bpf/inject.h (sys_enter hooks, sock_ops, sk_msg), built the way
// bpf/gymtrace.c builds them once injection is integrated.
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "common/contract.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define GT_INJECT
#include "syscalls.h"
#include "inject.h"

struct http_event gt_contract_http_event __attribute__((unused));
enum gt_event_kind gt_contract_kind __attribute__((unused));
enum gt_event_flag gt_contract_flag __attribute__((unused));
enum gt_stat gt_contract_stat __attribute__((unused));
struct gt_config gt_contract_config __attribute__((unused));
struct gt_target gt_contract_target __attribute__((unused));
enum gt_inject_stat gt_contract_inject_stat __attribute__((unused));
enum gt_inject_cfg_flag gt_contract_inject_cfg __attribute__((unused));
