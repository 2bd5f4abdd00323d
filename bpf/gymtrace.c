//go:build ignore

// gymtrace's BPF programs: one compilation unit, split by concern into headers.
#include "common/kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "common/contract.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#ifndef GT_K510 // no injection on 5.10 (it needs 6.10): the parser stays lean there
#define GT_INJECT // syscalls.h tells bpf/inject.h about message starts
#endif
#include "syscalls.h"
#include "lifecycle.h"
#include "python_probes.h" // asyncio causality: PyContext_CopyCurrent return and call-site probes
#include "python_uvloop.h" // uvloop: the UVStream write probe (deferred writes)
#include "tls.h" // HTTPS: OpenSSL uprobes, attached per process by internal/tls
#include "inject.h" // traceparent into outbound requests: sys_enter hooks, sock_ops, sk_msg (internal/inject)

// Contract types that no map names are kept in BTF so bpf2go generates them.
struct http_event gt_contract_http_event __attribute__((unused));
struct proc_event gt_contract_proc_event __attribute__((unused));
struct genai_event gt_contract_genai_event __attribute__((unused));
enum gt_genai_dialect gt_contract_genai_dialect __attribute__((unused));
enum gt_genai_have gt_contract_genai_have __attribute__((unused));
enum gt_sandbox_provider gt_contract_provider __attribute__((unused));
enum gt_sandbox_verb gt_contract_verb __attribute__((unused));
enum gt_target_flag gt_contract_target_flag __attribute__((unused));
enum gt_event_kind gt_contract_kind __attribute__((unused));
enum gt_side gt_contract_side __attribute__((unused));
enum gt_role gt_contract_role __attribute__((unused));
enum gt_method gt_contract_method __attribute__((unused));
enum gt_event_flag gt_contract_flag __attribute__((unused));
enum gt_gap gt_contract_gap __attribute__((unused));
enum gt_stat gt_contract_stat __attribute__((unused));
enum gt_sys_prog gt_contract_sys_prog __attribute__((unused));
enum gt_config_flag gt_contract_cfg_flag __attribute__((unused));
enum gt_inject_stat gt_contract_inject_stat __attribute__((unused));
enum gt_inject_cfg_flag gt_contract_inject_cfg __attribute__((unused));
enum gt_prof_section gt_contract_prof __attribute__((unused));
enum gt_py_status gt_contract_py_status __attribute__((unused));
enum gt_py_reg gt_contract_py_reg __attribute__((unused));
enum gt_py_site_flag gt_contract_py_site_flag __attribute__((unused));
struct gt_trace_ctx gt_contract_trace_ctx __attribute__((unused));
