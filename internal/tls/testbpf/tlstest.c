//go:build ignore

// Test object for internal/tls: bpf/gymtrace.c's programs plus bpf/tls.h, so
// the TLS programs can be loaded, attached and checked against live
// processes without touching the committed object.
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "common/contract.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#include "syscalls.h"
#include "tls.h"

struct http_event gt_contract_http_event __attribute__((unused));
enum gt_event_kind gt_contract_kind __attribute__((unused));
enum gt_event_flag gt_contract_flag __attribute__((unused));
enum gt_stat gt_contract_stat __attribute__((unused));
struct gt_config gt_contract_config __attribute__((unused));
struct gt_target gt_contract_target __attribute__((unused));
