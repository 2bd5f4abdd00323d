// The maps. Sizes are defaults; the loader may resize before load.
#pragma once

#include "conn.h"

#define GT_TARGET_WORDS 65536 // bitmap of tgids: 65536 * 64 = 4194304 = pid_max limit

// Bitmap of traced tgids. An array lookup is inlined by the verifier, so an
// untargeted process pays one load and a bit test per traced syscall.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GT_TARGET_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} gt_target_bits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct gt_target);
} gt_targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_config);
} gt_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct gt_route_key);
	__type(value, __u64);
} gt_routes SEC(".maps");

// LRU: connections of crashed or killed targets are evicted, never leaked.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct gt_conn_key);
	__type(value, struct gt_conn);
} gt_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} gt_events SEC(".maps");

// Server connections whose request record found no room in gt_events when
// the request ended (c->req_late), by conn_id: where that request's handler
// finds it again at its first call (gt_late_for_call, bpf/emit.h), to write
// the record before the call's. LRU: an entry whose request was written at
// its response, or whose connection closed, is left for eviction.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct gt_conn_key);
} gt_late_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GT_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} gt_stats SEC(".maps");

#define GT_SCRATCH 4096
#define GT_SCRATCH_MASK (GT_SCRATCH - 1)

// Loop-carried state lives here, in map memory, not in registers: the
// verifier does not track precision of values loaded from a map, so a loop
// over 4 KiB of header converges after one iteration instead of exploding.
struct gt_scan {
	__u32 ls;   // start of the current line
	__s32 end;  // offset just past the header block, -1 until found
	__u8 skip;  // the current line is not a header (start line, or a continuation)
	__u8 chunked;
	__u8 upgrade;
	__u8 host_found;
	__u8 tp_found;
	__u8 tp_any; // a traceparent header line of any value (bpf/inject.h)
	__u8 _pad[2];
	__s64 cl;
	__u32 host_at;
	__u32 host_len; // to the end of the Host line
	__u32 tp_at;
	__u32 nl_count; // newlines recorded in nl[]
	__u32 last_nl;  // position of the previous newline + 1 (0: none yet)
};

#define GT_MAX_LINES 64 // header lines examined per syscall buffer

struct gt_loops {
	__u32 proc_off;  // gt_process: offset in the current user buffer
	__u32 chunk_off; // gt_chunks
	__u64 iov_left;  // gt_on_io: bytes of the syscall not yet processed
	__u64 csize;     // gt_chunks: chunk-size line being parsed
	__s32 cnl;
	__u8 cdigits;
	__u8 cext;
	__u8 chunk_err; // gt_chunks: a chunk-size line did not parse
	__u8 _pad_steps;
	__u8 line[16];
	__u64 ga_ubuf;  // gt_chunks: a model exchange's chunk data for gt_step to walk (bpf/http_genai.h)
	__u32 ga_len;
	__u32 steps; // gt_process: steps taken in this buffer (up to GT_MAX_STEPS_PER_BUF)
};

// gt_scan_reward's walk over a /verify response body (bpf/http_reward.h).
struct gt_reward_scan {
	__s32 depth;    // '{' and '[' minus '}' and ']' since the first candidate key
	__s32 low;      // the live candidate's depth (the level of its object)
	__u32 vat;      // gt_reward_candidate: offset of the value being looked at
	__u32 pos;      // offset of the next byte to walk in the window
	__u8 tracking;  // a candidate key was seen: string state and depth are exact from there
	__u8 in_str;    // inside a string (only known once tracking)
	__u8 esc;       // ... right after a backslash
	__u8 last;      // the last non-whitespace byte walked, 0 before the first
	__u8 have;      // there is a live candidate: its object has not closed
	__u8 closed;    // its object closed, with '}', and only whitespace followed
	__u8 count;     // candidates at the live one's level (more than one: none is taken)
	__u8 valid;     // the live candidate's value is a JSON number in text[]
	__u8 state;     // gt_reward_number: JSON number grammar state
	__u8 _pad[3];
	__u8 text[GT_REWARD_MAX]; // the number's text, NUL-padded
};

// gt_headers' parts (bpf/headers.h): the state they share.
struct gt_hdr_run {
	__u32 carry; // bytes of a cut header line at buf's start
	__u32 max;   // the most this run may read
	__u32 nr;    // bytes read from the user buffer
	__u32 n;     // bytes to scan: carry + nr
	__u8 pre;    // gt_peek_start's read holds the first nr bytes already
	__u8 reuse;  // injection's sys_enter read and scanned them already
	__u8 _pad[6];
};

struct gt_scratch {
	__u8 buf[GT_SCRATCH + 128]; // slack so fixed-size reads at a masked offset stay inside
	struct gt_scan scan;
	struct gt_hdr_run hr;
	__u16 nl[GT_MAX_LINES]; // newline positions found by the word scan
	struct gt_loops loops;
	struct gt_route_key route_key;
	struct gt_reward_scan rw;
	__u8 peek[32];    // a message start, with bytes kept from the previous syscall
	__u32 peek_flags; // gt_peek_start: accumulators
	// The header scan gt_inject_check made at a write's sys_enter, for the
	// parser at the same write's sys_exit (gt_headers_body) to use instead of
	// reading and scanning the same bytes again. Valid while reuse_id is the
	// thread's pid_tgid; every other writer of buf clears it.
	__u32 reuse_n;   // bytes read into buf
	__u64 reuse_id;  // pid_tgid of the write, 0: nothing to reuse
	__u64 reuse_ubuf;
	__u64 reuse_gen; // also in the thread's gt_inject_rec: that very syscall
	__u32 reuse_max;
	// The first bytes of the message start gt_peek_start met in this
	// program run, read once for the start line, the path and the header
	// block's first window (GT_HDR_FIRST bytes): buf[0, pre_n) holds the
	// user bytes at pre_ubuf while pre_id is the thread's pid_tgid. Every
	// other writer of buf clears pre_id, and so does gt_process on entry.
	__u32 pre_n;
	__u64 pre_id;
	__u64 pre_ubuf;
	struct gt_conn conn; // a zeroed template for new connections
	// gt_late_conns' key and value (bpf/emit.h), here and not on the
	// stack: the syscall programs' deepest chain has no room left on 6.1,
	// and a connection's fields are plain memory to 6.1's verifier inside
	// a global function, where no map key may point.
	__u64 late_id;
	struct gt_conn_key late_key;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_scratch);
} gt_scratch SEC(".maps");
