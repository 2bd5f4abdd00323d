// Per-connection state. Kernel-private: userspace only sees http_event records.
#pragma once

#include "contract.h"

enum gt_conn_kind {
	GT_CONN_HTTP = 1,     // TCP socket that carries (or may carry) HTTP/1.x
	GT_CONN_IGNORE = 2,   // not a TCP socket, or not HTTP: one lookup and out
	GT_CONN_UPGRADED = 3, // after 101 Switching Protocols: no longer HTTP
};

// Parser phase of one direction of a connection.
enum gt_phase {
	GT_PH_IDLE = 0,    // expecting a message start
	GT_PH_HEADERS = 1, // inside a header block that spans syscalls
	GT_PH_BODY_CL = 2, // Content-Length body: remaining bytes
	GT_PH_CHUNKED = 3, // chunked body
	GT_PH_BODY_EOF = 4,// body ends when the connection does
	GT_PH_SKIP = 5,    // gated-off or unparseable message: resync at the next start
};

enum gt_chunk_phase {
	GT_CH_SIZE = 0, // expecting a chunk-size line
	GT_CH_DATA = 1, // remaining = data bytes + CRLF
	GT_CH_LAST = 2, // after the 0-size chunk: remaining = final CRLF
};

#define GT_CARRY 96 // longest header-line tail kept across syscalls (traceparent needs 67)

struct gt_dir {
	__u8 phase;
	__u8 chunk_phase;
	__u8 mid_line; // the header scan stopped inside a line
	__u8 is_req;   // this direction carries requests
	__u32 hdr_scanned;
	__s64 cl;        // Content-Length of the message being parsed, -1 when absent
	__u8 chunked;    // Transfer-Encoding: chunked seen
	__u8 upgrade;    // Upgrade header seen
	__u8 scan_rollout; // scan this request's body for Gym's rollout keys
	__u8 scan_reward;  // scan this response's body for its reward (reward_ring)
	// The TCP stream position just past the last bytes the parser followed in
	// this direction (gt_pos_check), when gt_conn.pos_ok says it is known.
	__u32 next_pos;
	__u8 scan_genai;   // walk this model exchange's body for its GenAI values (genai_ring, bpf/http_genai.h)
	// A chunk-size line cut by the end of a syscall's buffer (a reader's
	// read can end anywhere): its digits so far + 1 (0: none), whether its
	// extension began, and its value so far; the next buffer goes on with it.
	__u8 size_part;
	__u8 size_ext;
	__u8 _pad;
	__u32 size_acc;
	__u64 remaining;
	__u64 body_len;
	__u64 start_ns;
};

struct gt_conn_key {
	__u32 tgid;
	__s32 fd;
};

struct gt_conn {
	__u8 kind; // enum gt_conn_kind
	__u8 side; // enum gt_side
	__u8 started; // a message start has been seen
	__u8 tls;     // enum gt_tls_state (bpf/tls_link.h): 0 for socket connections
	__u32 cfg_gen;
	__u64 conn_id;
	__u64 req_seq;   // requests started
	__u64 resp_seq;  // final responses started
	__u64 skip_ring; // bit (i % 64): request i was gated off
	__u64 head_ring; // bit (i % 64): request i was HEAD (its response has no body)
	__u64 emitted_ring; // bit (i % 64): request i was emitted
	// bit (i % 64): request i is a /verify (verify group, enabled, with
	// GT_CFG_REWARD) whose response body is scanned for its reward. Kept per
	// request because a pipelined next request may have replaced req.
	__u64 reward_ring;
	// bit (i % 64): request i is a model call (model_call's routes on a
	// model server, model_call or rollout enabled, GT_CFG_GENAI) whose
	// bodies are walked for model names and token counts.
	__u64 genai_ring;
	struct gt_dir dir[2]; // [0] = bytes read, [1] = bytes written
	struct gt_tuple tuple;
	__u64 last_resp_ctx; // asyncio context that started the last response (a spawner candidate)
	__u64 msg_ubuf;      // where the message gt_py_note is told about starts (uvloop write probe key)
	// The first bytes of a message start that arrived alone (Go's net/http
	// server reads 1 byte after each request): kept until the next syscall
	// completes them.
	__u8 partial_len;
	__u8 partial_dir;
	__u8 partial[14];
	// The tail of a header line cut by the end of a syscall buffer (a
	// header block split by the network), completed by the next one.
	__u8 carry_len;
	__u8 carry_dir;
	__u8 served_noted; // bpf/inject.h: this server connection's process is in gt_inject_serving
	__u8 fresh; // seen from the stream's first byte (gt_conn_fresh): requests carry GT_F_FRESH
	__u8 gap;   // enum gt_gap: GT_GAP_FRAMING sticks, GT_GAP_LOST until the next request record
	__u8 pos_ok; // bit d: dir[d].next_pos is known
	// The responses of every request seen were given up at a gap in the
	// response direction (gt_pos_check): a response with no request seen is
	// one of those, not a sign of an unseen request. Until the next request.
	__u8 resp_given_up;
	// The buffer had no room for req's record when the request ended: req
	// holds it, ready to write late (gt_emit_late_request). Until the next
	// request starts.
	__u8 req_late;
	// The connection's struct sock, read at its first syscall (gt_conn_get):
	// its stream positions date each request start (gt_stream_seq). Only
	// ever dereferenced through probe reads; the entry is deleted at close.
	__u64 sk;
	__u8 carry[GT_CARRY];
	__u16 resp_status;
	__u16 resp_flags;
	__s32 tls_fd; // TLS connections: the linked socket's fd, -1 until linked
	struct http_event req; // the request being assembled
};
