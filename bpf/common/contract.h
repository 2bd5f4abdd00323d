// The kernel <-> userspace contract: every struct, enum and constant that a BPF
// program writes and Go reads. bpf2go turns these into Go types (internal/loader),
// so nothing here is written twice. Layout rules: fixed sizes, explicit padding,
// no packed structs, u64 fields 8-aligned; the Go side decodes records in place.
#pragma once

#include "groups.h"
#include "python_contract.h"

#define GT_PATH_MAX 128
#define GT_HOST_MAX 64
#define GT_TRACEPARENT_LEN 55 // "00-" 32 hex "-" 16 hex "-" 2 hex
#define GT_ROLLOUT_ID_MAX 48
#define GT_REWARD_MAX 24 // the text of a /verify response's reward number (bpf/http_reward.h, gt_scan_reward)
#define GT_ROUTE_PATH_MAX 60
#define GT_MODEL_MAX 128 // a model name read from a model exchange's body (bpf/http_genai.h)
#define GT_MAX_ROLES 8

enum gt_event_kind {
	GT_EV_REQUEST = 1,  // a complete HTTP request (headers + body) on one connection
	GT_EV_RESPONSE = 2, // a complete HTTP response
	GT_EV_CLOSE = 3,    // a connection with an exchange still in flight was closed
	GT_EV_PROC_FORK = 4, // a target forked a child process (struct proc_event)
	GT_EV_PROC_EXEC = 5, // a target's child, or a Gym entry point, called exec
	GT_EV_PROC_EXIT = 6, // a target process exited
	GT_EV_SANDBOX_START = 7, // a target's child exec'd a sandbox provider CLI
	GT_EV_SANDBOX_END = 8,   // ... and exited
	GT_EV_GENAI = 9,         // the GenAI values of a model exchange (struct genai_event), just before its response
	GT_EV_STARTUP_LISTEN = 10, // a process born under a target called listen() (struct proc_event; startup group, bpf/startup.h)
	GT_EV_STARTUP_READY = 11,  // ... and first wrote on a connection to that port: its first answer
};

// The API a model server's route speaks (struct genai_event dialect).
enum gt_genai_dialect {
	GT_GENAI_NONE = 0,
	GT_GENAI_CHAT = 1,      // /v1/chat/completions: usage.prompt_tokens, usage.completion_tokens
	GT_GENAI_RESPONSES = 2, // /v1/responses: usage.input_tokens, usage.output_tokens
	GT_GENAI_MESSAGES = 3,  // /v1/messages: usage.input_tokens, usage.output_tokens
};

// Which values a genai_event holds (bit i: field i).
enum gt_genai_have {
	GT_GH_REQ_MODEL = 1 << 0,
	GT_GH_RESP_MODEL = 1 << 1,
	GT_GH_INPUT = 1 << 2,
	GT_GH_OUTPUT = 1 << 3,
};

// The values the kernel read from a model exchange's bodies (server side;
// bpf/http_genai.h): two model names and two counts, nothing else of the
// bodies. Emitted right before the exchange's response record, so the
// request it names (conn_id, seq) is still waiting for it in userspace.
struct genai_event {
	__u8 kind;    // GT_EV_GENAI
	__u8 dialect; // enum gt_genai_dialect
	__u8 have;    // enum gt_genai_have
	__u8 sse;     // the response was an SSE stream
	__u32 pid;
	__u64 conn_id;
	__u64 seq; // the request's index on its connection (http_event seq)
	__u32 input_tokens;
	__u32 output_tokens;
	__u16 req_model_len;
	__u16 resp_model_len;
	__u32 _pad;
	__u8 req_model[GT_MODEL_MAX];  // printable ASCII, req_model_len bytes
	__u8 resp_model[GT_MODEL_MAX];
};

enum gt_sandbox_provider {
	GT_SB_NONE = 0,
	GT_SB_DOCKER = 1,
	GT_SB_APPTAINER = 2,
	GT_SB_ENROOT = 3,
};

// What the CLI was asked to do: Gym's sandbox spans are start and exec.
enum gt_sandbox_verb {
	GT_SBV_OTHER = 0, // rm, remove, stop...: lifecycle only, no span
	GT_SBV_START = 1, // docker run, apptainer instance start, enroot create|start
	GT_SBV_EXEC = 2,  // docker exec, apptainer exec, enroot exec
};

// Which end of the TCP connection the traced process is.
enum gt_side {
	GT_SIDE_UNKNOWN = 0,
	GT_SIDE_SERVER = 1, // accepted: the process reads requests and writes responses
	GT_SIDE_CLIENT = 2, // connected: the process writes requests and reads responses
};

// Gym's server types. 0 until userspace learns it.
enum gt_role {
	GT_ROLE_UNKNOWN = 0,
	GT_ROLE_AGENT = 1,        // responses_api_agents
	GT_ROLE_MODEL = 2,        // responses_api_models
	GT_ROLE_RESOURCES = 3,    // resources_servers
	GT_ROLE_ORCHESTRATOR = 4, // the collector / head server
};

enum gt_method {
	GT_M_UNKNOWN = 0,
	GT_M_GET = 1,
	GT_M_POST = 2,
	GT_M_PUT = 3,
	GT_M_DELETE = 4,
	GT_M_PATCH = 5,
	GT_M_HEAD = 6,
	GT_M_OPTIONS = 7,
	GT_M_CONNECT = 8,
	GT_M_TRACE = 9,
};

enum gt_event_flag {
	GT_F_TRACEPARENT = 1 << 0,     // traceparent[] holds the header's value
	GT_F_PATH_TRUNCATED = 1 << 1,  // path[] is not the whole path: longer than GT_PATH_MAX, or the read ended in it
	GT_F_END_BY_CLOSE = 1 << 2,    // the body ended when the connection closed
	GT_F_CHUNKED = 1 << 3,         // Transfer-Encoding: chunked
	GT_F_UPGRADE = 1 << 4,         // 101 Switching Protocols: the connection stops being HTTP
	GT_F_RESYNC = 1 << 5,          // first message seen on a connection that predates attach
	GT_F_CONN_ERROR = 1 << 6,      // the connection failed (reset, read/write error)
	GT_F_HOST = 1 << 7,            // host[] holds the Host header's value
	GT_F_ROLLOUT = 1 << 8,         // rollout holds ids read from a /run body
	GT_F_HDR_TRUNCATED = 1 << 9,   // the header block was larger than the kernel scans
	GT_F_BODY_UNKNOWN = 1 << 10,   // framing was lost; the message end is approximate
	GT_F_TLS = 1 << 11,            // plaintext read through TLS library probes (https)
	GT_F_INJECTED = 1 << 12,       // (client requests) traceparent[] was inserted by gymtrace (bpf/inject.h)
	GT_F_KERNEL_TRACE = 1 << 13,   // (server requests) the kernel started a trace for this request and
				       // published it for injection: traceparent[0:16] is its raw trace id,
				       // traceparent[16] its sampled bit (bpf/inject.h, gt_inject_root)
	GT_F_FRESH = 1 << 14,          // (requests) gymtrace saw this connection from its first byte in this
				       // direction (gt_conn_fresh): both ends' requests on it pair in order
	GT_F_REWARD = 1 << 15,         // (server responses to /verify) reward[] holds the text of the body's
				       // top-level "reward" number (bpf/http_reward.h, gt_scan_reward)
};

// What a request record says the kernel lost on its connection (struct
// http_event gap).
enum gt_gap {
	// This direction's framing was lost at least once (bytes the parser could
	// not follow: a message start may have gone unseen), so the request
	// index (seq) may differ from the peer's for good.
	GT_GAP_FRAMING = 1 << 0,
	// A record of this connection was lost (ring buffer full) since the
	// previous request record.
	GT_GAP_LOST = 1 << 1,
	// This request's record is late: the buffer had no room when the
	// request ended, and it was written later, at its handler's first call
	// or its response's first bytes (gt_emit_late_request, bpf/emit.h).
	// Records of calls its handler made before that came before it. Its
	// times are the request's own.
	GT_GAP_LATE = 1 << 2,
};

// Statistics slots of the per-CPU counter array gt_stats.
enum gt_stat {
	GT_STAT_EMITTED = 0,       // + group bit index: events emitted per group
	GT_STAT_DISCARDED = 16,    // + group bit index: events dropped by the gate per group
	GT_STAT_RINGBUF_FULL = 32, // records lost for room: reservations that failed, responses shed
	GT_STAT_NOT_HTTP = 33,     // socket messages that were not HTTP/1.x
	GT_STAT_PARSE_ERROR = 34,  // HTTP framing the kernel could not follow
	GT_STAT_HDR_TRUNCATED = 35,
	GT_STAT_CONN_FULL = 36,    // connection table insertions that failed
	GT_STAT_RESYNC = 37,       // connections picked up mid-stream
	GT_STAT_SKIPPED_BYTES = 38,// bytes on gated-off messages never copied out
	GT_STAT_PROC_EVENTS = 39,  // process lifecycle events emitted
	GT_STAT_TLS_CALLS = 40,    // TLS library probe runs in target processes
	GT_STAT_TLS_EVENTS = 41,   // http events emitted from TLS plaintext
	GT_STAT_TLS_LINKED = 42,   // SSL objects linked to their socket
	GT_STAT_UNSAMPLED = 43,    // inbound requests whose traceparent says not sampled: nothing copied out
	GT_STAT_SCAN_REUSED = 44,  // request heads parsed from injection's scan at sys_enter, not read again
	GT_STAT_FRESH = 45,        // connections followed from their first byte (GT_F_FRESH)
	GT_STAT_REWARD_FOUND = 46, // /verify responses whose reward number the kernel read (GT_F_REWARD)
	GT_STAT_REWARD_MISSED = 47,// /verify responses meant to be scanned that gave no usable reward:
				   // not found, ambiguous, malformed, outside the window, or a body the
				   // scan does not follow (chunked, ended by close, framing lost, none)
	GT_STAT_SCAN_PREREAD = 48, // header blocks scanned from the read made at their message start
	// Followed connections whose bytes moved unseen between two syscalls the
	// programs saw (gt_pos_check): a skipped program, an unhooked syscall.
	GT_STAT_STREAM_GAP = 49,
	// ... of those, gaps inside a Content-Length body: skipped exactly, nothing lost.
	GT_STAT_STREAM_GAP_BODY = 50,
	// Model exchanges' GenAI fields (request model, response model, input
	// and output tokens; bpf/http_genai.h), one count per field:
	GT_STAT_GENAI_READ = 51,       // read
	GT_STAT_GENAI_ABSENT = 52,     // not in the body (a stream without usage, an error answer's body)
	GT_STAT_GENAI_AMBIGUOUS = 53,  // twice where once is meant, or events that disagree
	GT_STAT_GENAI_MALFORMED = 54,  // not a model name (printable, <= 128 bytes, no escapes) or a count (integer < 2^31)
	GT_STAT_GENAI_INCOMPLETE = 55, // bytes of the body not walked (framing lost, past the walk's reach), or its JSON unclosed
	// Connection entries found stale: the fd now names another socket (its
	// close went unseen); ended as at a close, followed afresh.
	GT_STAT_STALE_CONN = 56,
	// Syscall events a program's understudy handled because the kernel
	// skipped the program itself (bpf/common/understudy.h): nothing lost.
	GT_STAT_STOOD_IN = 57,
	// Response records not written because the ring buffer was crowded
	// (gt_shed_bytes, bpf/common/util.h): its last eighth is kept for
	// request records. Each is a record lost, counted in
	// GT_STAT_RINGBUF_FULL as well.
	GT_STAT_RESPONSE_SHED = 58,
	// Request records written late (at their handler's first call or their
	// response's first bytes) after the buffer had no room for them when
	// the request ended (GT_GAP_LATE): each of these was counted in
	// GT_STAT_RINGBUF_FULL then, and arrived.
	GT_STAT_REQUEST_LATE = 59,
	GT_STAT_MAX = 60,
};

// The syscall programs that have an understudy (bpf/common/understudy.h):
// each one's slot in gt_sys_tails, and the mark it leaves in gt_sys_ran.
enum gt_sys_prog {
	GT_SYS_EXIT_READ = 0,
	GT_SYS_EXIT_RECVFROM = 1,
	GT_SYS_EXIT_READV = 2,
	GT_SYS_EXIT_RECVMSG = 3,
	GT_SYS_EXIT_WRITE = 4,
	GT_SYS_EXIT_SENDTO = 5,
	GT_SYS_EXIT_WRITEV = 6,
	GT_SYS_EXIT_SENDMSG = 7,
	GT_SYS_ENTER_CLOSE = 8,
	GT_SYS_EXIT_LISTEN = 9,
	GT_SYS_INJECT_WRITE = 10, // injection's sys_enter programs (bpf/inject.h)
	GT_SYS_INJECT_SENDTO = 11,
	GT_SYS_INJECT_WRITEV = 12,
	GT_SYS_INJECT_SENDMSG = 13,
	GT_SYS_PROGS = 14,
};

struct gt_tuple {
	__u8 laddr[16]; // local address; IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d)
	__u8 raddr[16]; // remote address
	__u16 lport;    // host byte order
	__u16 rport;
	__u16 family; // AF_INET or AF_INET6 of the socket
	__u16 _pad;
};

// Rollout identity read from a /run request body: only these keys are scanned
// for, and only their values leave the kernel.
struct gt_rollout {
	__s32 task;    // _ng_task_index, -1 when absent
	__s32 rollout; // _ng_rollout_index
	__s32 attempt; // _ng_attempt_index
	__u16 id_len;  // _ng_rollout_id
	__u16 _pad;
	__u8 id[GT_ROLLOUT_ID_MAX];
};

// One record per HTTP message. No header value other than traceparent and
// Host is ever written here, and no body byte but the values the kernel
// scans for: rollout ids (/run requests) and the reward (/verify responses).
struct http_event {
	__u8 kind;   // enum gt_event_kind
	__u8 side;   // enum gt_side
	__u8 method; // enum gt_method (requests)
	__u8 role;   // enum gt_role at emit time
	__u16 flags; // enum gt_event_flag
	__u16 status;
	__u32 pid; // tgid in the initial PID namespace
	__u32 tid;
	__s32 fd;
	__u16 path_len;
	__u16 host_len;
	__u64 conn_id;  // unique per traced connection for this gymtrace instance
	__u64 seq;      // index of this message on its connection, per direction
	__u64 start_ns; // bpf_ktime_get_ns() when the first byte crossed the syscall
	__u64 end_ns;   // ... when the last byte did
	__u64 groups;   // the exchange's group bits that passed the gate
	__u64 body_len; // body size in bytes (a size, never content); close
			// records: the responses that ended on the connection
	__u64 py_ctx;   // asyncio Context identity of the syscall, 0 when unknown
	__u64 py_root;  // the request-handler Context that py_ctx works for (bpf/python.h)
	// Client requests: the inbound request whose handler made this call, as
	// the kernel bound it (conn_id and seq of that server request); 0 when
	// unknown. See gt_py_link.req_conn.
	__u64 cause_conn;
	__u64 cause_seq;
	// Requests on a TCP socket: the sequence number of the message's first
	// byte in its direction's stream (tcp_sock write_seq or copied_seq, less
	// what the syscall moved after it). Both ends of a connection on this
	// node see the same number for the same request, so the two records
	// pair exactly, in any order and on a connection picked up mid-stream
	// (internal/spans join.go). stream_ok is 0 where the kernel could not
	// say (TLS plaintext, no socket).
	__u32 stream_seq;
	__u8 stream_ok;
	// Requests and closes: enum gt_gap bits, what the kernel lost on this
	// connection before this record (userspace pairs nothing by a count it
	// cannot trust).
	__u8 gap;
	__u8 _pad_stream[2];
	struct gt_tuple tuple;
	// Responses with GT_F_REWARD: the number's JSON text, NUL-padded (a
	// number has no NUL); the only body bytes that ever leave the kernel
	// in a response record.
	__u8 reward[GT_REWARD_MAX];
	__u8 path[GT_PATH_MAX]; // request path without the query string
	__u8 host[GT_HOST_MAX];
	__u8 traceparent[56];
	struct gt_rollout rollout;
};

// Response and close records end here: the fields after tuple are a reward
// (responses with GT_F_REWARD only, which end at GT_HTTP_EVENT_REWARD) and
// request data. Userspace reads the record's length and zero-fills the rest.
#define GT_HTTP_EVENT_HEAD __builtin_offsetof(struct http_event, reward)
#define GT_HTTP_EVENT_REWARD __builtin_offsetof(struct http_event, path)

enum gt_target_flag {
	GT_TARGET_CHILD = 1 << 0, // added by the kernel at fork: a child of a target
};

// Process targets: one hash entry per traced tgid.
struct gt_target {
	__u8 role;  // enum gt_role
	__u8 flags;
	__u16 _pad;
	__u32 _pad2;
};

// Gate configuration, one element of the gt_config array.
struct gt_config {
	__u64 mask; // enabled group bits
	// Per role: every group an inbound request to a server of that role can
	// belong to. When (possible & mask) == 0 no byte of the message is read.
	__u64 server_possible[GT_MAX_ROLES];
	__u64 client_possible; // groups of an outbound request (http_client)
	__u32 flags;           // enum gt_config_flag
	__u32 generation;      // bumped on every change; connections resynchronise
};

enum gt_config_flag {
	GT_CFG_ROLLOUT_IDS = 1 << 0, // scan /run bodies for rollout ids
	GT_CFG_NO_GATE = 1 << 1,     // benchmark mode: emit every message, filter in Go
	GT_CFG_REWARD = 1 << 2,      // read the reward number from /verify response bodies (verify group)
	GT_CFG_KEEP_UNSAMPLED = 1 << 3, // copy out inbound requests their caller did not sample: Gym's metrics count them
	GT_CFG_GENAI = 1 << 4,       // read model names and token counts from model servers' bodies (model_call or rollout)
};

// Route table key: (role, method, path with any /ng-rollout/<id> prefix removed).
struct gt_route_key {
	__u8 role;
	__u8 method;
	__u16 _pad;
	__u8 path[GT_ROUTE_PATH_MAX];
};

// Process lifecycle record (GT_EV_PROC_* and GT_EV_SANDBOX_*). Shares its first
// byte (kind) with http_event so one ring buffer carries both. No argv byte
// and no environment byte is ever written here: a sandbox CLI is reduced to
// its provider and verb.
struct proc_event {
	__u8 kind;     // enum gt_event_kind
	__u8 role;     // role of the target involved (the parent for fork/sandbox)
	__u8 provider; // enum gt_sandbox_provider
	__u8 verb;     // enum gt_sandbox_verb
	__u32 pid;     // the process the event is about
	__u32 ppid;    // its parent (the target, for fork and sandbox events)
	__u32 tid;     // the parent's thread that forked (for causality)
	__s32 exit_code; // GT_EV_PROC_EXIT / GT_EV_SANDBOX_END: exit status (0..255), or -signal
	__u16 port;      // GT_EV_STARTUP_*: the local port the process listens on
	__u16 _pad;
	__u64 ts_ns;  // bpf_ktime_get_ns()
	__u64 start_ns; // GT_EV_SANDBOX_END: when the sandbox CLI was exec'd
	__u64 py_ctx; // asyncio context of the forking thread, 0 when unknown
	__u64 py_root;
	__u64 cause_conn; // the inbound request whose handler forked (see http_event)
	__u64 cause_seq;
	__u8 comm[16];
};

// Sections timed when gt_prof_time is set (cost experiments only).
enum gt_prof_section {
	GT_PROF_IO = 0,          // gt_on_io past the target test
	GT_PROF_CONN = 1,        // connection lookup / creation
	GT_PROF_PY_NOTE = 2,     // gt_py_note (asyncio context, spawners, cause)
	GT_PROF_INJ_NOTE = 3,    // gt_inject_note
	GT_PROF_START_REQ = 4,   // gt_start_request up to the header parse
	GT_PROF_ROUTE = 5,       // route-table lookup
	GT_PROF_HEADERS = 6,     // gt_headers
	GT_PROF_SCAN = 7,        // gt_scan_headers
	GT_PROF_EMIT = 8,        // a request or response record
	GT_PROF_ROLLOUT = 9,     // gt_scan_rollout
	GT_PROF_INJ_ENTER = 10,  // injection's sys_enter program past the target test
	GT_PROF_INJ_CHECK = 11,  // gt_inject_check
	GT_PROF_INJ_DECIDE = 12, // gt_inject_decide
	GT_PROF_PY_COPY = 13,    // the PyContext_CopyCurrent return probe
	GT_PROF_PROCESS = 14,    // gt_process (all steps of one buffer)
	GT_PROF_START_RESP = 15, // gt_start_response
	GT_PROF_PEEK = 16,       // gt_peek_start + classify
	GT_PROF_PY_UVWRITE = 17, // the uvloop write probe
	GT_PROF_REWARD = 18,     // gt_scan_reward
	GT_PROF_MAX = 24,
};

// traceparent injection (bpf/inject.h, docs/injection.md).
//
// gt_trace_ctx: userspace publishes, for every inbound request it made a span
// for, the trace an outbound call made by that request's handler belongs to.
// Key {conn_id, seq} of the server request; {0, tgid} is the process's
// gym.job (a collector's calls that no inbound request caused).
struct gt_trace_key {
	__u64 conn;
	__u64 seq;
};

struct gt_trace_ctx {
	__u8 trace_id[16];
	__u8 span_id[8]; // the enclosing span (the CLIENT span's parent), for userspace
	__u8 flags;      // W3C trace-flags: bit 0 sampled
	__u8 _pad[7];
};

enum gt_inject_cfg_flag {
	GT_INJ_ON = 1 << 0, // prepare injections at the write syscalls
};

// One element of gt_inject_config.
struct gt_inject_config {
	// A new trace's sampled bit: (big-endian trace_id[8:16] >> 1) < root_bound,
	// as OpenTelemetry's TraceIDRatioBased decides (ratio * 2^63).
	__u64 root_bound;
	__u32 flags; // enum gt_inject_cfg_flag
	__u32 _pad;
};

// Per-CPU counters of gt_inject_stats.
enum gt_inject_stat {
	GT_INJ_STAT_PREPARED = 0,   // request starts on which a traceparent was decided
	GT_INJ_STAT_PUSHED = 1,     // ... and inserted by the sk_msg program
	GT_INJ_STAT_INJECTED = 2,   // ... and reported in a request record (GT_F_INJECTED)
	GT_INJ_STAT_MISS = 3,       // the cause was known but userspace had not published its trace yet
	GT_INJ_STAT_HAS_TP = 4,     // the request already carried a traceparent: left alone
	GT_INJ_STAT_SPLIT = 5,      // the header block was not whole in the first buffer: not injected
	GT_INJ_STAT_UNATTRIBUTED = 6,// a serving process's call with no known cause: not injected
	GT_INJ_STAT_ROOT = 7,       // injected as a new trace (a process that never served)
	GT_INJ_STAT_NOT_PUSHED = 8, // decided, but the socket is not in the sockhash (connected before attach)
	GT_INJ_STAT_PUSH_FAIL = 9,  // the sk_msg program could not insert (checks or helpers failed)
	GT_INJ_STAT_SOCKS = 10,     // client sockets of targets added to the sockhash
	GT_INJ_STAT_SOCK_FAIL = 11, // ... that could not be added (full, or another instance owns it)
	GT_INJ_STAT_MAX = 16,
};
