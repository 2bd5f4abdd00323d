// The reward of a /verify response, read in the kernel: gt_scan_reward, which
// message.h calls on the buffer that ends the body. It walks http.h's body
// windows (gt_read_window); only the number's text leaves this file.
#pragma once

#include "http.h"

// The reward of a /verify response: Gym's resources servers answer with
// {"responses_create_params": {...}, "response": {...}, "reward": 0.75}, tens
// of KiB (more than 64 KiB is common) with the reward near the end, and a
// subclass may add a few fields after it. The echoed request can hold a
// "reward" key of its own, so only a key of the top-level object is taken.
//
// Bounded work: only the buffer that ends a Content-Length body is scanned,
// in its last GT_REWARD_WINDOWS windows: the last 8,128 bytes of that buffer
// (all of it when shorter). The key, and everything after it up to the
// body's final '}', must lie there; whatever is not found there is not
// guessed (GT_STAT_REWARD_MISSED). Nothing but the number's text is kept.
#define GT_REWARD_WINDOWS 2
#define GT_JSON_WS_MAX 4 // whitespace bytes taken on each side of the key's ':'

static __always_inline int gt_json_ws(__u8 c)
{
	return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// JSON number grammar, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, as a
// table: gt_num_next[state * 6 + class]. Classes: 0 '0', 1 '1'-'9', 2 '-',
// 3 '+', 4 '.', 5 'e'/'E'. States: 0 start, 1 after '-', 2 a leading 0,
// 3 integer digits, 4 after '.', 5 fraction digits, 6 after 'e', 7 after the
// exponent's sign, 8 exponent digits; 9 is an error. A number may end in 2,
// 3, 5 or 8.
#define GT_NUM_ERR 9
static const __u8 gt_num_next[9 * 6] = {
	2, 3, 1, 9, 9, 9, // 0 start
	2, 3, 9, 9, 9, 9, // 1 '-'
	9, 9, 9, 9, 4, 6, // 2 '0'
	3, 3, 9, 9, 4, 6, // 3 integer
	5, 5, 9, 9, 9, 9, // 4 '.'
	5, 5, 9, 9, 9, 6, // 5 fraction
	8, 8, 7, 7, 9, 9, // 6 'e'
	8, 8, 9, 9, 9, 9, // 7 exponent sign
	8, 8, 9, 9, 9, 9, // 8 exponent
};

static __always_inline __u8 gt_num_class(__u8 c)
{
	if (c == '0')
		return 0;
	if (c >= '1' && c <= '9')
		return 1;
	if (c == '-')
		return 2;
	if (c == '+')
		return 3;
	if (c == '.')
		return 4;
	if ((c | 0x20) == 'e')
		return 5;
	return 6; // not part of a number
}

// Checks the JSON number at buf[at] of the window [0, n) against the grammar
// and copies its text to sc->rw.text. 1 when it is one of at most
// GT_REWARD_MAX bytes followed, inside the window, by whitespace, ',' or '}'
// (what may follow a member's value); 0 when it is malformed, longer, or cut
// by the window's end (the last window ends with the body, so a number there
// would end the body: not JSON).
static __always_inline int gt_reward_number(struct gt_scratch *sc, __u32 at, __u32 n)
{
	struct gt_reward_scan *r = &sc->rw;
	__builtin_memset(r->text, 0, sizeof(r->text));
	r->state = 0;
	int j;
	gt_for(j, 0, GT_REWARD_MAX + 1)
	{
		if (at + j >= n)
			return 0;
		__u8 c = sc->buf[(at + j) & GT_SCRATCH_MASK];
		__u8 cls = gt_num_class(c);
		__u32 st = r->state;
		if (st >= GT_NUM_ERR)
			return 0;
		if (cls == 6)
			return (st == 2 || st == 3 || st == 5 || st == 8) && (gt_json_ws(c) || c == ',' || c == '}');
		if (j >= GT_REWARD_MAX)
			return 0; // longer than the record carries
		r->state = gt_num_next[st * 6 + cls];
		r->text[j] = c;
	}
	return 0;
}

// buf[i] is a '"' after ',' or '{' outside any string the walk knows of: is
// it the key "reward" (then whitespace, ':', whitespace)? If so it is a
// member of some object, and a candidate: from here on the walk knows string
// state and depth exactly. The first candidate, or the first after the live
// one's object closed, becomes the live one (its value is checked); one at
// the live one's level is a duplicate; one deeper is nested in the live
// one's value and can never be top level while the live one could be.
// Global, so it is verified once and not at every byte of the walk.
GT_GLOBAL int gt_reward_candidate(struct gt_scratch *sc, __u32 i, __u32 n)
{
	if (!sc)
		return 0;
	struct gt_reward_scan *r = &sc->rw;
	const __u8 *s = sc->buf;
	if (i + 8 >= n || !GT_KEY_IS(s, i + 1, "reward\""))
		return 0;
	r->vat = i + 8;
#pragma unroll
	for (int k = 0; k < GT_JSON_WS_MAX; k++)
		if (r->vat < n && gt_json_ws(s[r->vat & GT_SCRATCH_MASK]))
			r->vat++;
	if (r->vat >= n || s[r->vat & GT_SCRATCH_MASK] != ':')
		return 0;
	r->vat++;
#pragma unroll
	for (int k = 0; k < GT_JSON_WS_MAX; k++)
		if (r->vat < n && gt_json_ws(s[r->vat & GT_SCRATCH_MASK]))
			r->vat++;
	if (!r->tracking) {
		r->tracking = 1;
		r->depth = 0;
	}
	if (!r->have) {
		r->have = 1;
		r->low = r->depth;
		r->count = 1;
		r->valid = gt_reward_number(sc, r->vat, n);
	} else if (r->depth == r->low && r->count < 255) {
		r->count++;
	}
	return 1;
}

struct gt_reward_ctx {
	struct gt_scratch *sc;
	__u32 end; // the walk stops here, where the next window takes over
	__u32 n;   // the window's bytes in sc->buf
};

// One step of gt_scan_reward's walk, at sc->rw.pos: eight bytes, or one.
// 1: the window's walk is over.
GT_LOOP_FN gt_reward_step(int k, struct gt_reward_ctx *cx)
{
	struct gt_scratch *sc = cx->sc;
	struct gt_reward_scan *r = &sc->rw;
	__u32 end = cx->end, n = cx->n;
	__u32 i = r->pos;
	if (i >= end)
		return 1;
	// Eight bytes in one step where none of them can matter: inside
	// a string, a word without '"' or '\'; before the first
	// candidate, a word without '"' whose last byte is not
	// whitespace (it becomes the last non-whitespace byte). Most of
	// a body is such words; the rest is walked a byte at a time.
	if (!(i & 7) && i + 8 <= end && !r->esc) {
		__u64 x = *(__u64 *)&sc->buf[i & (GT_SCRATCH - 8)];
		__u8 top = x >> 56;
		if (r->in_str ? !GT_HAS_BYTE(x, '"') && !GT_HAS_BYTE(x, '\\')
			      : !r->tracking && !GT_HAS_BYTE(x, '"') && !gt_json_ws(top)) {
			if (!r->in_str)
				r->last = top;
			r->pos = i + 8;
			return 0;
		}
	}
	r->pos = i + 1;
	__u8 c = sc->buf[i & GT_SCRATCH_MASK];
	if (r->in_str) {
		if (r->esc)
			r->esc = 0;
		else if (c == '\\')
			r->esc = 1;
		else if (c == '"')
			r->in_str = 0, r->last = c;
		return 0;
	}
	if (gt_json_ws(c))
		return 0;
	r->closed = 0; // a byte after the live candidate's object: it was not the body's end
	if (c == '"') {
		if ((r->last == ',' || r->last == '{') && sc->buf[(i + 1) & GT_SCRATCH_MASK] == 'r')
			gt_reward_candidate(sc, i, n);
		if (r->tracking)
			r->in_str = 1; // a key or string value opens (the candidate's key too)
	} else if (r->tracking) {
		if (c == '{' || c == '[') {
			r->depth++;
		} else if (c == '}' || c == ']') {
			r->depth--;
			if (r->have && r->depth < r->low) {
				// The live candidate's object ends here.
				r->have = 0;
				r->closed = c == '}';
			}
		}
	}
	r->last = c;
	return 0;
}

// Scans the buffer [ubuf, ubuf + len) that ends a /verify response's body
// for the top-level "reward" number. Returns GT_F_REWARD with its text in
// sc->rw.text (for gt_emit_response, which runs next), or 0.
//
// One walk, front to back, over the windows (each byte once: a window walks
// up to where the next one starts, and the overlap leaves a candidate's
// lookahead inside the window that sees its key). A key is a candidate when
// the last non-whitespace byte before it is ',' or '{': a quote inside a
// string is escaped, so '\"reward\"' never is. From the first candidate on,
// string state (quotes, backslash escapes) and '{' '[' / '}' ']' depth are
// tracked; a candidate is top level iff the depth never drops below its own
// until the body's last non-whitespace byte, a '}', takes it one below.
// Found: exactly one such candidate, its value a JSON number.
__noinline int gt_scan_reward(__u64 ubuf, __u32 len)
{
#ifdef GT_K510
	return 0; // a byte-by-byte walk of the body needs bpf_loop (common/k510.h)
#endif
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return 0;
	struct gt_reward_scan *r = &sc->rw;
	__builtin_memset(r, 0, sizeof(*r));
	int w;
	gt_for(w, 0, GT_REWARD_WINDOWS)
	{
		__u32 off;
		int got = gt_read_window(sc, ubuf, len, w, GT_REWARD_WINDOWS, 0, &off);
		if (got == 0)
			break; // the previous window was the last
		if (got < 0)
			return 0; // a hole in the walk: nothing after it can be trusted
		__u32 n = got;
		__u32 next = gt_window_off(len, w + 1, GT_REWARD_WINDOWS, 0);
		__u32 end = (w + 1 < GT_REWARD_WINDOWS && next < len) ? next - off : n;
		if (end > n)
			end = n;
		// At most end steps, each at least one byte on (r->pos, map memory).
		r->pos = 0;
		struct gt_reward_ctx cx = {.sc = sc, .end = end, .n = n};
		gt_loop((int)end, gt_reward_step, &cx);
	}
	return (r->closed && r->count == 1 && r->valid) ? GT_F_REWARD : 0;
}
