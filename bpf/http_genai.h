// GenAI values of a model server's exchanges (and of its own calls upstream),
// read in the kernel: the
// request's "model", the response's "model" and its input and output token
// counts, for the three dialects Gym's model servers serve (chat completions,
// responses, messages), JSON or SSE. Only those values leave this file, in a
// genai_event record (bpf/common/contract.h) emitted just before the
// exchange's response record (docs/security.md has the limits).
//
// Unlike the reward (http_reward.h), which a /verify body carries near its
// end, these keys can be anywhere: the OpenAI client puts "model" after the
// whole conversation (hundreds of KiB), a stream puts usage in its last
// event. So every body byte of such an exchange is walked, from the body's
// first byte, with the walk's state kept between syscalls in gt_genai (map
// memory, one entry per connection): string state, escapes and the depth of
// '{' '[' are exact from the first byte, so a key inside a string (an
// escaped "\"model\"" in a message) is never a key, and a key nested deeper
// than the dialect puts it is not taken.
//
// Values: a model name is at most GT_MODEL_MAX bytes of printable ASCII
// without escapes; a token count a JSON integer below 2^31. Anything else,
// a key that comes twice where it should come once (JSON), models that
// disagree between events (SSE), a body whose bytes were not all walked, or
// whose JSON did not close, is not recorded; each field is counted by why
// (GT_STAT_GENAI_*).
#pragma once

#include "http.h"

// Fields (bit i of have / a reason per field).
#define GT_GA_REQ_MODEL 0
#define GT_GA_RESP_MODEL 1
#define GT_GA_IN 2
#define GT_GA_OUT 3

// Why a field was not recorded (gt_genai.why[field]).
enum gt_ga_why {
	GT_GW_NONE = 0,       // not seen
	GT_GW_AMBIGUOUS = 1,  // more than once where once is meant, or events disagree
	GT_GW_MALFORMED = 2,  // not a string / integer of the allowed form
	GT_GW_INCOMPLETE = 3, // bytes of the body were not walked, or its JSON did not close
};

// Key classes (what a key means where it is).
enum gt_ga_key {
	GT_GK_NONE = 0,
	GT_GK_MODEL = 1,
	GT_GK_USAGE = 2,
	GT_GK_WRAP = 3, // "response" (responses SSE) / "message" (messages SSE): the object holding model and usage
	GT_GK_IN = 4,
	GT_GK_OUT = 5,
};

// Walk modes.
enum gt_ga_mode {
	GT_JM_START = 0,     // before the body's first non-whitespace byte
	GT_JM_JSON = 1,      // inside the body's JSON value
	GT_JM_DONE = 2,      // the JSON value closed; only whitespace may follow
	GT_JM_SSE_LINE = 3,  // SSE: matching "data:" at a line's start (col)
	GT_JM_SSE_SKIP = 4,  // SSE: a line that is not data, up to its '\n'
	GT_JM_SSE_DATA = 5,  // SSE: after "data:", before the event's JSON
	GT_JM_SSE_JSON = 6,  // SSE: inside a data line's JSON
	GT_JM_SSE_AFTER = 7, // SSE: the data line's JSON closed; whitespace to '\n'
	GT_JM_DEAD = 8,      // not a body these keys can be read from for sure
};

// The object context of a depth: what holds the keys met there.
enum gt_ga_obj {
	GT_GC_OTHER = 0,
	GT_GC_ROOT = 1,
	GT_GC_WRAP = 2,
	GT_GC_USAGE = 3,     // usage at the top level (JSON, chat chunks, message_delta)
	GT_GC_USAGE_IN = 4,  // usage inside the wrap (response.completed, message_start)
};

// The keys the walk knows, matched a byte at a time as a key's string goes
// by (gt_jscan kmask): no key text is kept.
#define GT_GA_KEYS 8
#define GT_GA_KEY_LEN 32
static const char gt_ga_keys[GT_GA_KEYS][GT_GA_KEY_LEN] = {
	"model", "usage", "response", "message", "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
};
enum gt_ga_keyid {
	GT_KI_MODEL = 0,
	GT_KI_USAGE = 1,
	GT_KI_RESPONSE = 2,
	GT_KI_MESSAGE = 3,
	GT_KI_PROMPT = 4,
	GT_KI_COMPLETION = 5,
	GT_KI_INPUT = 6,
	GT_KI_OUTPUT = 7,
};
#define GT_GA_MAX_DEPTH 63
#define GT_GA_WINDOWS 64 // windows of GT_SCRATCH bytes walked per syscall buffer (256 KiB)

// One direction's walk over a body, across syscalls.
struct gt_jscan {
	__u64 objmask; // bit d: the container at depth d (1 = the body's value) is an object
	__u64 num;     // the token count being read
	__u32 pos;     // next byte of the window
	__u16 vlen;    // model bytes of the value being read
	__u8 mode;     // enum gt_ga_mode
	__u8 depth;
	__u8 in_str;
	__u8 esc;
	__u8 last;   // last structural byte outside strings
	__u8 kcap;   // the open string is a key whose text is kept
	__u8 klen;   // its length so far
	__u8 kmask;  // bit i: the key so far is a prefix of gt_ga_keys[i]
	__u8 pend;   // the key just closed (enum gt_ga_key), its value not begun
	__u8 colon;  // ... and its ':' was seen
	__u8 vfield; // the value being read goes to this field (GT_GA_*), 0xff none
	__u8 vint;   // reading a token count's digits
	__u8 vdigits;
	__u8 vstr;   // reading a model string
	__u8 vcmp;   // ... compared with the value already kept (SSE), not written
	__u8 vbad;   // ... and it is not one (why)
	__u8 col;    // SSE: bytes of "data:" matched
	__u8 sse;    // the body is an SSE stream
	__u8 cut;    // bytes of the body were not walked: nothing of it is sure
	__u8 ctx[4]; // enum gt_ga_obj of depths 1..4
	__u8 _pad[3];
};

// The state of a model exchange on one connection (gt_genai, by conn_id).
struct gt_genai {
	struct gt_jscan js[2]; // [0] the request's body, [1] the response's (flip maps syscall directions)
	__u64 seq;             // the request these values belong to
	__u8 dialect;          // enum gt_genai_dialect
	__u8 have;             // bit per field: its value is kept
	__u8 seen;             // bit per field: met at least once
	__u8 why[4];           // per field: enum gt_ga_why when not kept
	__u8 wdir;             // the direction being walked (gt_ga_window, gt_ga_step)
	__u8 flip;             // a CLIENT call: its request is written (syscall dir 1), its response read
	__u32 wn;              // the window's bytes in the scratch
	__u32 wlen;            // the buffer's bytes
	__u64 wubuf;           // the buffer
	__u16 mlen[2];         // [0] request model, [1] response model
	__u32 tok[2];          // [0] input, [1] output
	__u8 model[2][GT_MODEL_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct gt_genai);
} gt_genai SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_genai);
} gt_genai_zero SEC(".maps");

#include "http_genai_walk.h" // the walk itself

// Window w of the buffer being walked: read into the scratch, then walked
// (gt_ga_step). A callback of its own, so the verifier checks it once, not
// once per window.
GT_LOOP_FN gt_ga_window(int w, struct gt_ga_walk *cx)
{
	struct gt_genai *g = cx->g;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 1;
	struct gt_jscan *js = &g->js[g->wdir & 1];
	__u32 off = (__u32)w * GT_SCRATCH, len = g->wlen;
	if (off >= len || js->mode == GT_JM_DEAD)
		return 1;
	__u32 n = len - off;
	if (n > GT_SCRATCH)
		n = GT_SCRATCH;
	sc->reuse_id = 0; // buf is overwritten (see struct gt_scratch)
	sc->pre_id = 0;
	if (bpf_probe_read_user(sc->buf, n, (void *)(g->wubuf + off))) {
		js->cut = 1;
		js->mode = GT_JM_DEAD;
		return 1;
	}
	js->pos = 0;
	g->wn = n;
	// n + 1 steps: each takes at least one byte, but for the step that
	// finds a body is an SSE stream, which takes its byte again.
	gt_loop((int)n + 1, gt_ga_step, cx);
	return 0;
}

// Walks len body bytes (a Content-Length body's, or a chunk's data) at ubuf
// of the model exchange on connection conn_id, read (dir 0) or written (dir
// 1; its request or its response by the connection's side: flip), a window
// of the scratch at a time.
__noinline int gt_scan_genai(__u64 conn_id, __u32 dir, __u64 ubuf, __u32 len)
{
#ifdef GT_K510
	return 0; // a byte-by-byte walk of the body needs bpf_loop (common/k510.h)
#endif
	struct gt_genai *g = bpf_map_lookup_elem(&gt_genai, &conn_id);
	if (!g)
		return 0;
	dir ^= g->flip & 1;
	struct gt_jscan *js = &g->js[dir & 1];
	if (js->mode == GT_JM_DEAD)
		return 0;
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	if (len > GT_GA_WINDOWS * GT_SCRATCH) {
		js->cut = 1; // more than one syscall's walk: not followed
		js->mode = GT_JM_DEAD;
		return 0;
	}
	struct gt_ga_walk cx = {.g = g};
	g->wdir = dir;
	g->wubuf = ubuf;
	g->wlen = len;
	gt_loop((int)((len + GT_SCRATCH - 1) / GT_SCRATCH), gt_ga_window, &cx);
	return 0;
}

// Body bytes of the model exchange that were not walked (past the iovec
// segments the programs read, or framing lost): nothing of it is sure.
__noinline int gt_genai_cut(__u64 conn_id, __u8 dir)
{
	struct gt_genai *g = bpf_map_lookup_elem(&gt_genai, &conn_id);
	if (g) {
		dir ^= g->flip & 1;
		g->js[dir & 1].cut = 1;
		g->js[dir & 1].mode = GT_JM_DEAD;
	}
	return 0;
}

// The route key of a model server's CLIENT request (c->req), as
// gt_route_key_from makes a SERVER's (/ng-rollout/<id> stripped), under the
// model role, its two scans bpf_loop callbacks: checked once each, not once
// per byte (a bounded build's unrolled copy of gt_route_key_from here cost
// every syscall program ~36,000 more verified instructions).
struct gt_ga_rk {
	struct http_event *ev;
	struct gt_route_key *k;
	__u32 at; // where the route starts
};

GT_LOOP_FN gt_ga_rk_find(int j, struct gt_ga_rk *cx)
{
	__u32 i = (__u32)j + 12; // after "/ng-rollout/"
	if (cx->ev->path[i & (GT_PATH_MAX - 1)] != '/')
		return 0;
	cx->at = i;
	return 1;
}

GT_LOOP_FN gt_ga_rk_copy(int j, struct gt_ga_rk *cx)
{
	__u32 src = cx->at + (__u32)j;
	if (src >= cx->ev->path_len)
		return 1;
	cx->k->path[j & 63] = cx->ev->path[src & (GT_PATH_MAX - 1)];
	return 0;
}

static __always_inline void gt_ga_route_key(struct gt_route_key *k, struct http_event *ev)
{
	const char pre[] = "/ng-rollout/";
	__u8 diff = ev->path_len > sizeof(pre) ? 0 : 1;
#pragma unroll
	for (int j = 0; j < (int)sizeof(pre) - 1; j++)
		diff |= ev->path[j] ^ pre[j];
	__builtin_memset(k, 0, sizeof(*k));
	k->role = GT_ROLE_MODEL;
	k->method = ev->method;
	struct gt_ga_rk cx = {.ev = ev, .k = k, .at = 0};
	if (!diff)
		gt_loop(GT_PATH_MAX - 12, gt_ga_rk_find, &cx);
	gt_loop(GT_ROUTE_PATH_MAX, gt_ga_rk_copy, &cx);
}

// A model request (index seq) starts on connection c, a model server's
// SERVER exchange or its CLIENT call upstream: its walk and values begin.
// The route the gate just looked up (the scratch's route key: "/v1/" then
// chat/completions, responses or messages) names the dialect; a CLIENT
// call's route is looked up here.
GT_GLOBAL int gt_genai_begin(struct gt_conn *c, struct gt_io *io, __u64 seq, __u64 groups)
{
	__u32 zero = 0;
	if (!c || !io)
		return 0;
	if (c->side == GT_SIDE_SERVER && !(groups & GT_GROUP_MODEL_CALL))
		return 0;
	// A model server's CLIENT call upstream, with http_client on for it
	// (--genai and model_call or rollout were checked by the caller).
	if (c->side != GT_SIDE_SERVER && (io->role != GT_ROLE_MODEL || !(io->mask & GT_GROUP_HTTP_CLIENT)))
		return 0;
	struct gt_scratch *sc = gt_get_scratch();
	struct gt_genai *z = bpf_map_lookup_elem(&gt_genai_zero, &zero);
	if (!sc || !z)
		return 0;
	if (c->side != GT_SIDE_SERVER) {
#ifdef GT_K510
		return 0; // nothing to walk with (gt_scan_genai)
#endif
		// A model call when the route table gives its path (under the
		// model role, /ng-rollout/<id> stripped) model_call: the decision
		// a SERVER exchange gets.
		gt_ga_route_key(&sc->route_key, &c->req);
		__u64 *rg = bpf_map_lookup_elem(&gt_routes, &sc->route_key);
		if (!rg || !(*rg & GT_GROUP_MODEL_CALL))
			return 0;
	}
	__u8 r = sc->route_key.path[4];
	__u8 dialect = r == 'c' ? GT_GENAI_CHAT : r == 'r' ? GT_GENAI_RESPONSES : r == 'm' ? GT_GENAI_MESSAGES : 0;
	if (!dialect)
		return 0;
	__builtin_memset(z, 0, sizeof(*z));
	z->seq = seq;
	z->dialect = dialect;
	z->flip = c->side != GT_SIDE_SERVER;
	z->js[0].vfield = 0xff;
	z->js[1].vfield = 0xff;
	__u64 id = c->conn_id;
	if (bpf_map_update_elem(&gt_genai, &id, z, BPF_ANY))
		return 0;
	c->genai_ring |= 1ULL << (seq & 63);
	c->dir[c->side == GT_SIDE_SERVER ? 0 : 1].scan_genai = 1; // the request's: a server reads it, a client writes it
	return 1;
}

// Whether a body walk ended sure: all of its bytes walked, its JSON closed
// (or its SSE stream at a line's start, outside any event).
static __always_inline int gt_ga_whole(struct gt_jscan *js)
{
	if (js->cut)
		return 0;
	if (js->sse)
		return js->mode == GT_JM_SSE_LINE && js->col == 0;
	return js->mode == GT_JM_DONE;
}

static __always_inline void gt_ga_count(struct gt_genai *g, __u32 f)
{
	f &= 3;
	if ((g->have >> f) & 1) {
		gt_stat_add(GT_STAT_GENAI_READ, 1);
		return;
	}
	__u8 why = g->seen & (1 << f) ? g->why[f] : GT_GW_NONE;
	gt_stat_add(GT_STAT_GENAI_ABSENT + (why & 3), 1);
}

// The body read (dir 0) or written (dir 1) ended, the request's or the
// response's by the connection's side (flip): settle its
// fields, and with the response emit the record.
GT_GLOBAL int gt_genai_end(struct gt_conn *c, struct gt_io *io, __u32 dir)
{
	if (!c || !io)
		return 0;
	__u64 id = c->conn_id;
	struct gt_genai *g = bpf_map_lookup_elem(&gt_genai, &id);
	if (!g)
		return 0;
	dir ^= g->flip & 1;
	struct gt_jscan *js = &g->js[dir & 1];
	int whole = gt_ga_whole(js);
	// Pipelining: a later request began (and took the entry) before this
	// message ended, so what the entry holds is not all this message's.
	__u64 idx = dir == 0 ? c->req_seq - 1 : c->resp_seq - 1;
	if (g->seq != idx) {
		gt_stat_add(GT_STAT_GENAI_INCOMPLETE, dir == 0 ? 1 : 3);
		js->mode = GT_JM_DEAD;
		return 0;
	}
	if (dir == 1)
		js->mode = GT_JM_DEAD; // nothing more on this entry's response
	if (dir == 0) {
		if (!whole && g->have & (1 << GT_GA_REQ_MODEL))
			gt_ga_fail(g, GT_GA_REQ_MODEL, GT_GW_INCOMPLETE);
		else if (!whole && js->mode != GT_JM_START)
			gt_ga_fail(g, GT_GA_REQ_MODEL, GT_GW_INCOMPLETE);
		gt_ga_count(g, GT_GA_REQ_MODEL);
		return 0;
	}
	if (!whole) {
		if (g->have & (1 << GT_GA_RESP_MODEL) || js->mode != GT_JM_START)
			gt_ga_fail(g, GT_GA_RESP_MODEL, GT_GW_INCOMPLETE);
		if (g->have & (1 << GT_GA_IN) || js->mode != GT_JM_START)
			gt_ga_fail(g, GT_GA_IN, GT_GW_INCOMPLETE);
		if (g->have & (1 << GT_GA_OUT) || js->mode != GT_JM_START)
			gt_ga_fail(g, GT_GA_OUT, GT_GW_INCOMPLETE);
	}
	gt_ga_count(g, GT_GA_RESP_MODEL);
	gt_ga_count(g, GT_GA_IN);
	gt_ga_count(g, GT_GA_OUT);
	if (!g->have)
		return 0;
	struct genai_event *e = bpf_ringbuf_reserve(&gt_events, sizeof(*e), 0);
	if (!e) {
		gt_stat_add(GT_STAT_RINGBUF_FULL, 1);
		c->gap |= GT_GAP_LOST;
		return 0;
	}
	e->kind = GT_EV_GENAI;
	e->dialect = g->dialect;
	e->have = g->have;
	e->sse = js->sse;
	e->pid = io->tgid;
	e->conn_id = id;
	e->seq = g->seq;
	e->input_tokens = g->tok[0];
	e->output_tokens = g->tok[1];
	e->req_model_len = (g->have & (1 << GT_GA_REQ_MODEL)) ? g->mlen[0] : 0;
	e->resp_model_len = (g->have & (1 << GT_GA_RESP_MODEL)) ? g->mlen[1] : 0;
	e->_pad = 0;
	// A model kept is all that leaves: a value that was not one (its bytes
	// up to where it failed) never does.
	if (e->req_model_len)
		__builtin_memcpy(e->req_model, g->model[0], GT_MODEL_MAX);
	else
		__builtin_memset(e->req_model, 0, GT_MODEL_MAX);
	if (e->resp_model_len)
		__builtin_memcpy(e->resp_model, g->model[1], GT_MODEL_MAX);
	else
		__builtin_memset(e->resp_model, 0, GT_MODEL_MAX);
	gt_submit(e);
	return 0;
}
