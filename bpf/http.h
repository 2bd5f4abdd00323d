// Bounded HTTP/1.x parsing: message starts, header block, body framing.
// Only method, path (no query), status, Host, traceparent and framing leave
// this file; every other header value and every body byte is skipped.
#pragma once

#include "common/util.h"
#include "common/iter.h"

#define GT_PEEK 16
// The header scan's first window: most header blocks fit in it.
#define GT_HDR_FIRST 512
// Parse steps (start, headers, body; a walked chunk of a model exchange takes
// one) inside one syscall buffer. 1024: a 256 KiB read (asyncio's and
// uvloop's read size) of a token-by-token SSE stream of ~250-byte events is
// about 1000 chunks; past the limit the rest of the buffer's framing is lost.
// A bound, not a cost: the loop runs as many steps as the buffer has. The
// k510 build walks no model body (no chunk takes a step of its own there)
// and verifies every iteration of this loop: 128 keeps its margin.
#ifdef GT_K510
#define GT_MAX_STEPS_PER_BUF 128
#else
#define GT_MAX_STEPS_PER_BUF 1024
#endif
#define GT_MAX_IOV_SEGS 4 // iovec segments parsed per vectored syscall; bytes past them: gt_iov_rest
#define GT_MAX_CHUNKS_PER_BUF 16
#define GT_MAX_HDR_BYTES (16 * 1024) // header blocks larger than this lose framing

enum gt_start {
	GT_START_NONE = 0,
	GT_START_REQUEST = 1,
	GT_START_RESPONSE = 2,
};

static __always_inline __u8 gt_lower(__u8 c)
{
	return (c >= 'A' && c <= 'Z') ? c | 0x20 : c;
}

// Classifies the first bytes of a buffer: a request line (method + space) or a
// status line ("HTTP/1.x NNN"). *arg gets the method, or the status code.
static __always_inline int gt_classify(const __u8 *p, int n, __u16 *arg, __u8 *mlen)
{
	if (n >= 12 && p[0] == 'H' && p[1] == 'T' && p[2] == 'T' && p[3] == 'P' && p[4] == '/' &&
	    p[5] == '1' && p[6] == '.' && p[8] == ' ') {
		__u8 a = p[9] - '0', b = p[10] - '0', c = p[11] - '0';
		if (a > 9 || b > 9 || c > 9 || a == 0)
			return GT_START_NONE;
		*arg = a * 100 + b * 10 + c;
		return GT_START_RESPONSE;
	}
	if (n < 4)
		return GT_START_NONE;
	__u8 m = GT_M_UNKNOWN, l = 0;
	switch (p[0]) {
	case 'G':
		if (p[1] == 'E' && p[2] == 'T' && p[3] == ' ')
			m = GT_M_GET, l = 3;
		break;
	case 'P':
		if (p[1] == 'O' && p[2] == 'S' && p[3] == 'T' && n > 4 && p[4] == ' ')
			m = GT_M_POST, l = 4;
		else if (p[1] == 'U' && p[2] == 'T' && p[3] == ' ')
			m = GT_M_PUT, l = 3;
		else if (n > 5 && p[1] == 'A' && p[2] == 'T' && p[3] == 'C' && p[4] == 'H' && p[5] == ' ')
			m = GT_M_PATCH, l = 5;
		break;
	case 'H':
		if (n > 4 && p[1] == 'E' && p[2] == 'A' && p[3] == 'D' && p[4] == ' ')
			m = GT_M_HEAD, l = 4;
		break;
	case 'D':
		if (n > 6 && p[1] == 'E' && p[2] == 'L' && p[3] == 'E' && p[4] == 'T' && p[5] == 'E' && p[6] == ' ')
			m = GT_M_DELETE, l = 6;
		break;
	case 'O':
		if (n > 7 && p[1] == 'P' && p[2] == 'T' && p[3] == 'I' && p[4] == 'O' && p[5] == 'N' &&
		    p[6] == 'S' && p[7] == ' ')
			m = GT_M_OPTIONS, l = 7;
		break;
	case 'C':
		if (n > 7 && p[1] == 'O' && p[2] == 'N' && p[3] == 'N' && p[4] == 'E' && p[5] == 'C' &&
		    p[6] == 'T' && p[7] == ' ')
			m = GT_M_CONNECT, l = 7;
		break;
	case 'T':
		if (n > 5 && p[1] == 'R' && p[2] == 'A' && p[3] == 'C' && p[4] == 'E' && p[5] == ' ')
			m = GT_M_TRACE, l = 5;
		break;
	}
	if (m == GT_M_UNKNOWN)
		return GT_START_NONE;
	// A request target starts with '/' (origin form), '*' or a scheme/authority.
	__u8 t = p[l + 1 < GT_PEEK ? l + 1 : GT_PEEK - 1];
	if (l + 1 < n && t != '/' && t != '*' && !(t >= 'a' && t <= 'z') && !(t >= 'A' && t <= 'Z'))
		return GT_START_NONE;
	*arg = m;
	*mlen = l;
	return GT_START_REQUEST;
}

// Case-insensitive match of a lower-case literal (letters, '-', ':') at s[at].
// Branch-free on purpose: an early exit per byte would give the verifier a
// path per prefix length to explore. One masked base and constant offsets
// (the scratch's slack holds a literal that starts below GT_SCRATCH; every
// caller has checked that it ends inside the bytes read): a register per
// byte offset, which the matches at one line start share, spilled the
// header scan's frame past 100 bytes.
#define GT_HDR_IS(s, at, lit)                                                          \
	({                                                                             \
		const __u8 *__p = &(s)[(at) & GT_SCRATCH_MASK];                        \
		__u8 __diff = 0;                                                       \
		_Pragma("unroll") for (int __j = 0; __j < (int)sizeof(lit) - 1; __j++) \
			__diff |= (__p[__j] | 0x20) ^ (lit)[__j];                      \
		__diff == 0;                                                           \
	})

// Case-sensitive variant of GT_HDR_IS, for JSON keys.
#define GT_KEY_IS(s, at, lit)                                                          \
	({                                                                             \
		const __u8 *__p = &(s)[(at) & GT_SCRATCH_MASK];                        \
		__u8 __diff = 0;                                                       \
		_Pragma("unroll") for (int __j = 0; __j < (int)sizeof(lit) - 1; __j++) \
			__diff |= __p[__j] ^ (lit)[__j];                               \
		__diff == 0;                                                           \
	})

// Skips `  :  ` after a JSON key; returns the offset of the value.
static __always_inline __u32 gt_json_value(const __u8 *s, __u32 at, __u32 n)
{
#pragma unroll
	for (int j = 0; j < 4; j++) {
		__u8 c = s[at & GT_SCRATCH_MASK];
		if (c == ' ' || c == ':')
			at++;
	}
	return at;
}

// Whether any byte of the 64-bit word x is b: a load and three ALU ops per
// eight bytes (the header scan's newlines, the reward scan's quotes).
#define GT_HAS_BYTE(x, b)                                                                  \
	((((x) ^ (0x0101010101010101ULL * (__u8)(b))) - 0x0101010101010101ULL) &           \
	 ~((x) ^ (0x0101010101010101ULL * (__u8)(b))) & 0x8080808080808080ULL)

// One header line [ls, le) of the scratch buffer; results go to sc->scan.
static __always_inline void gt_header_line(struct gt_scratch *sc, __u32 ls, __u32 le, int is_req)
{
	const __u8 *s = sc->buf;
	__u8 c0 = s[ls & GT_SCRATCH_MASK] | 0x20;
	__u32 v;
	if (c0 == 'c' && le > ls + 15 && GT_HDR_IS(s, ls, "content-length:")) {
		// Digits accumulate in map memory, not in a register the verifier
		// would have to track per path.
		v = ls + 15;
		sc->scan.cl = 0;
		int j;
		gt_for(j, 0, 20)
		{
			__u8 c = s[(v + j) & GT_SCRATCH_MASK];
			if (v + j >= le)
				break;
			if (c == ' ')
				continue;
			if (c < '0' || c > '9')
				break;
			sc->scan.cl = sc->scan.cl * 10 + (c - '0');
		}
	} else if (c0 == 't' && le > ls + 18 && GT_HDR_IS(s, ls, "transfer-encoding:")) {
		// "chunked" as the (last) coding; Gym's servers send it alone.
		v = ls + 18;
		if (s[v & GT_SCRATCH_MASK] == ' ')
			v++;
		if (le >= v + 7 && GT_HDR_IS(s, v, "chunked"))
			sc->scan.chunked = 1;
	} else if (is_req && c0 == 't' && le > ls + 12 && GT_HDR_IS(s, ls, "traceparent:")) {
		sc->scan.tp_any = 1;
		v = ls + 12;
		if (s[v & GT_SCRATCH_MASK] == ' ')
			v++;
		if (le >= v + GT_TRACEPARENT_LEN) {
			sc->scan.tp_found = 1;
			sc->scan.tp_at = v;
		}
	} else if (is_req && c0 == 'h' && le > ls + 5 && GT_HDR_IS(s, ls, "host:")) {
		v = ls + 5;
		if (s[v & GT_SCRATCH_MASK] == ' ')
			v++;
		sc->scan.host_found = 1;
		sc->scan.host_at = v;
		sc->scan.host_len = le > v ? le - v : 0;
	} else if (c0 == 'u' && le > ls + 8 && GT_HDR_IS(s, ls, "upgrade:")) {
		sc->scan.upgrade = 1;
	}
}

// Prepares sc->scan for gt_scan_headers. skip: the buffer starts inside a
// line that is not a header (the start line, or a continuation).
static __always_inline void gt_scan_begin(struct gt_scratch *sc, __u8 skip)
{
	sc->scan.skip = skip;
	sc->scan.cl = -1;
	sc->scan.chunked = 0;
	sc->scan.upgrade = 0;
	sc->scan.host_found = 0;
	sc->scan.tp_found = 0;
	sc->scan.tp_any = 0;
}

// What gt_scan_headers' two passes share (gt_loop's ctx).
struct gt_hdr_ctx {
	struct gt_scratch *sc;
	__u32 n;
	int is_req;
};

// Pass 1 of gt_scan_headers at word w: the newlines of sc->buf[8w, 8w + 8).
// 1: the block ended (or the line table is full).
GT_LOOP_FN gt_nl_word(int w, struct gt_hdr_ctx *cx)
{
	struct gt_scratch *sc = cx->sc;
	__u32 n = cx->n;
	__u32 base = (w * 8) & (GT_SCRATCH - 8);
	__u64 x = *(__u64 *)&sc->buf[base];
	if (!GT_HAS_BYTE(x, '\n'))
		return 0;
	int done = 0;
#pragma unroll
	for (int k = 0; k < 8; k++) {
		if (((x >> (8 * k)) & 0xff) != '\n' || base + k >= n || done)
			continue;
		__u32 idx = sc->scan.nl_count;
		if (idx >= GT_MAX_LINES) {
			done = 1;
			continue;
		}
		sc->nl[idx & (GT_MAX_LINES - 1)] = base + k;
		sc->scan.nl_count = idx + 1;
		// "\n\n" or "\n\r\n": the blank line that ends the block.
		__u32 prev = sc->scan.last_nl;
		if (prev && (base + k == prev || (base + k == prev + 1 && sc->buf[prev & GT_SCRATCH_MASK] == '\r')))
			done = 1;
		sc->scan.last_nl = base + k + 1;
	}
	return done;
}

// Pass 2 of gt_scan_headers at line li (of sc->nl): the line, if it is a
// header gymtrace reads. 1: the blank line that ends the block.
GT_LOOP_FN gt_hdr_line(int li, struct gt_hdr_ctx *cx)
{
	struct gt_scratch *sc = cx->sc;
	__u32 i = sc->nl[li & (GT_MAX_LINES - 1)];
	__u32 ls = sc->scan.ls;
	__u32 le = i;
	if (le > ls && sc->buf[(le - 1) & GT_SCRATCH_MASK] == '\r')
		le--;
	if (le == ls && !sc->scan.skip) {
		sc->scan.end = i + 1;
		return 1;
	}
	if (!sc->scan.skip && le > ls)
		gt_header_line(sc, ls, le, cx->is_req);
	sc->scan.skip = 0;
	sc->scan.ls = i + 1;
	return 0;
}

#ifdef GT_K510
// 5.10 (no bpf_loop): the two passes as plain loops whose steps are global
// functions of the index alone, each verified once. A static step was
// verified again at every step, in every state, past the 1M-instruction
// limit at 64 steps. What the steps share with the scan (n, is_req) waits
// in gt_k510_hdr; the scratch is the CPU's.
struct gt_k510_hdr {
	__u32 n;
	int is_req;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gt_k510_hdr);
} gt_k510_hdr SEC(".maps");

static __always_inline int gt_k510_hdr_cx(struct gt_hdr_ctx *cx)
{
	__u32 zero = 0;
	struct gt_k510_hdr *h = bpf_map_lookup_elem(&gt_k510_hdr, &zero);
	cx->sc = gt_get_scratch();
	if (!h || !cx->sc)
		return -1;
	cx->n = h->n;
	cx->is_req = h->is_req;
	return 0;
}

__noinline int gt_k510_nl_word(int w)
{
	struct gt_hdr_ctx cx;
	if (gt_k510_hdr_cx(&cx))
		return 1;
	return gt_nl_word(w, &cx);
}

__noinline int gt_k510_hdr_line(int li)
{
	struct gt_hdr_ctx cx;
	if (gt_k510_hdr_cx(&cx))
		return 1;
	return gt_hdr_line(li, &cx);
}

// Both passes, whole: GT_SCRATCH / 8 words, then up to GT_MAX_LINES lines.
static __always_inline void gt_k510_scan_headers(struct gt_scratch *sc, __u32 n, int is_req)
{
	__u32 zero = 0;
	struct gt_k510_hdr *h = bpf_map_lookup_elem(&gt_k510_hdr, &zero);
	if (!h)
		return;
	h->n = n;
	h->is_req = is_req;
	int w, words = (n + 7) / 8;
	for (w = 0; w < words && w < GT_SCRATCH / 8; w++)
		if (gt_k510_nl_word(w))
			break;
	sc = gt_get_scratch();
	if (!sc)
		return;
	int li, lines = sc->scan.nl_count;
	for (li = 0; li < lines && li < GT_MAX_LINES; li++)
		if (gt_k510_hdr_line(li))
			break;
}
#endif

// Scans sc->buf[0, n) for header lines until the blank line. sc->scan must be
// set up by the caller (skip = the buffer starts inside a line that is not a
// header). Sets sc->scan.end to the offset just past the header block, or -1.
GT_GLOBAL int gt_scan_headers(struct gt_scratch *sc, __u32 n, int is_req)
{
	if (!sc)
		return 0;
	if (n > GT_SCRATCH)
		n = GT_SCRATCH;
	sc->scan.ls = 0;
	sc->scan.end = -1;
	sc->scan.nl_count = 0;
	sc->scan.last_nl = 0;
	if (gt_prof_skip & 1)
		return 0;

	// Pass 1, eight bytes at a time: where are the newlines? A word without
	// one costs a load and three ALU ops; the block ends at the first empty
	// line, so the scan stops there.
#ifdef GT_K510
	gt_k510_scan_headers(sc, n, is_req);
	return 0;
#endif
	struct gt_hdr_ctx cx = {.sc = sc, .n = n, .is_req = is_req};
	gt_loop((int)((n + 7) / 8), gt_nl_word, &cx);

	// Pass 2, a line at a time: only the few headers gymtrace reads.
	gt_loop((int)sc->scan.nl_count, gt_hdr_line, &cx);
	return 0;
}
GT_K510_S(gt_scan_headers, (__u32 n, int is_req), 0, sc, n, is_req)
#ifdef GT_K510
#define gt_scan_headers(sc, ...) gt_scan_headers_k510(__VA_ARGS__)
#endif

// Copies the request target up to a space, '?' (the query never leaves the
// kernel) or the end of the line into ev->path; sets ev->path_len.
static __always_inline void gt_copy_path(const __u8 *s, __u32 at, __u32 n, struct http_event *ev)
{
	int j;
	ev->path_len = 0;
	gt_for(j, 0, GT_PATH_MAX)
	{
		__u32 k = at + j, m = k;
		gt_mask(m, GT_SCRATCH_MASK); // clang drops the mask after k < n; 6.1 then loses the bound
		__u8 c = s[m];
		if (k >= n || c == ' ' || c == '?' || c == '#' || c == '\r' || c == '\n')
			break;
		ev->path[j & (GT_PATH_MAX - 1)] = c;
		ev->path_len = j + 1;
	}
	if (ev->path_len == GT_PATH_MAX) {
		__u8 c = s[(at + GT_PATH_MAX) & GT_SCRATCH_MASK];
		if (at + GT_PATH_MAX < n && c != ' ' && c != '?' && c != '\r')
			ev->flags |= GT_F_PATH_TRUNCATED;
	} else if (at + ev->path_len >= n) {
		// The read ended inside the path: a request line written in
		// pieces (n is below its cap here, so these were all the bytes).
		// The rest comes in a later read; what is here is not the path.
		ev->flags |= GT_F_PATH_TRUNCATED;
	}
}

// Fills k, the route-table key: the path with a leading /ng-rollout/<id>
// removed, as Gym's model and resources middlewares do. k lives in map memory
// (the per-CPU scratch) so the loops below keep no state in registers.
static __always_inline void gt_route_key_from(struct gt_route_key *k, const struct http_event *ev, __u8 role)
{
	const char pre[] = "/ng-rollout/";
	__u8 diff = ev->path_len > sizeof(pre) ? 0 : 1;
#pragma unroll
	for (int j = 0; j < (int)sizeof(pre) - 1; j++)
		diff |= ev->path[j] ^ pre[j];
	__builtin_memset(k, 0, sizeof(*k));
	k->role = role;
	k->method = ev->method;
	// k->_pad holds the offset where the route starts while we look for it.
	k->_pad = 0;
	int j;
	if (!diff) {
		gt_for(j, sizeof(pre) - 1, GT_PATH_MAX)
		{
			if (ev->path[j & (GT_PATH_MAX - 1)] == '/') {
				k->_pad = j;
				break;
			}
		}
	}
	gt_for(j, 0, GT_ROUTE_PATH_MAX)
	{
		__u32 src = k->_pad + j;
		if (src >= ev->path_len)
			break;
		k->path[j & 63] = ev->path[src & (GT_PATH_MAX - 1)];
	}
	k->_pad = 0;
}

// Body scans read a syscall buffer through the per-CPU scratch, one window
// of GT_SCRATCH (4096) bytes at a time, and this is the one place that says
// where the windows lie. Window w starts w * GT_WIN_STEP into the buffer, so
// neighbours overlap by GT_WIN_OVERLAP bytes and a key with its value on a
// boundary is whole in one of them. A scan of nwin windows, the first nhead
// of them "head" windows: in a buffer longer than the nwin windows laid end
// to end (nwin * GT_WIN_STEP + GT_WIN_OVERLAP bytes) the windows from nhead
// on are aligned to the buffer's end instead, the last one ending with it;
// in a buffer no longer than that the windows cover it whole.
#define GT_WIN_OVERLAP 64
#define GT_WIN_STEP (GT_SCRATCH - GT_WIN_OVERLAP)

static __always_inline __u32 gt_window_off(__u32 len, __u32 w, __u32 nwin, __u32 nhead)
{
	if (len > nwin * GT_WIN_STEP + GT_WIN_OVERLAP && w >= nhead)
		return len - (nwin - w) * GT_WIN_STEP - GT_WIN_OVERLAP; // the buffer's tail
	return w * GT_WIN_STEP;
}

// Reads window w of the user buffer [ubuf, ubuf + len) into sc->buf.
// Returns the bytes read (at most GT_SCRATCH), 0 when the buffer has no
// window w (it ends before), -1 when the read failed. *off gets the
// window's offset in the buffer.
static __always_inline int gt_read_window(struct gt_scratch *sc, __u64 ubuf, __u32 len, __u32 w, __u32 nwin,
					  __u32 nhead, __u32 *off)
{
	__u32 o = gt_window_off(len, w, nwin, nhead);
	*off = o;
	if (o >= len)
		return 0;
	__u32 n = len - o;
	if (n > GT_SCRATCH)
		n = GT_SCRATCH;
	sc->reuse_id = 0; // buf is overwritten (see struct gt_scratch)
	sc->pre_id = 0;
	if (bpf_probe_read_user(sc->buf, n, (void *)(ubuf + o)))
		return -1;
	return n;
}

// The rollout scan's windows of each /run body buffer: the first two and, in
// a buffer longer than four (16,192 bytes), the last two. Gym rows can put
// the _ng_* keys after a whole conversation, so the body's last buffer ends
// with them.
#define GT_ROLLOUT_WINDOWS 4

// Parses a JSON integer value at s[at] into *out (map memory). A value that
// runs to the end of the buffer may go on in the next syscall's: it is not
// taken (-1, not found), never a wrong number.
static __always_inline void gt_json_int(const __u8 *s, __u32 at, __u32 n, __s32 *out)
{
	int j, digits = 0, ended = 0;
	__s32 v = 0;
	gt_for(j, 0, 10)
	{
		__u8 c = s[(at + j) & GT_SCRATCH_MASK];
		if (at + j >= n)
			break;
		if (c < '0' || c > '9') {
			ended = 1;
			break;
		}
		v = v * 10 + (c - '0');
		digits++;
	}
	*out = (digits && ended) ? v : -1;
}

struct gt_rollout_ctx {
	struct gt_scratch *sc;
	struct http_event *ev;
	__u32 n; // the window's bytes in sc->buf
};

// gt_scan_rollout's step at byte i of a window: a rollout key there, and
// its value.
GT_LOOP_FN gt_rollout_at(int i, struct gt_rollout_ctx *cx)
{
	struct gt_scratch *sc = cx->sc;
	struct http_event *ev = cx->ev;
	__u32 n = cx->n;
	const __u8 *s = sc->buf;
	// Keys must lie inside this read: past n the scratch holds
	// older bytes. (Values are bounded by n where they are parsed.)
	if (i + 5 > n || s[i & GT_SCRATCH_MASK] != '"' || !GT_KEY_IS(s, i + 1, "_ng_"))
		return 0;
	__u32 k = i + 5, v;
	if (k + 11 <= n && GT_KEY_IS(s, k, "task_index\"")) {
		v = gt_json_value(s, k + 11, n);
		gt_json_int(s, v, n, &ev->rollout.task);
	} else if (k + 14 <= n && GT_KEY_IS(s, k, "rollout_index\"")) {
		v = gt_json_value(s, k + 14, n);
		gt_json_int(s, v, n, &ev->rollout.rollout);
	} else if (k + 14 <= n && GT_KEY_IS(s, k, "attempt_index\"")) {
		v = gt_json_value(s, k + 14, n);
		gt_json_int(s, v, n, &ev->rollout.attempt);
	} else if (k + 11 <= n && GT_KEY_IS(s, k, "rollout_id\"")) {
		v = gt_json_value(s, k + 11, n);
		if (s[v & GT_SCRATCH_MASK] != '"')
			return 0;
		int j, closed = 0;
		ev->rollout.id_len = 0;
		gt_for(j, 0, GT_ROLLOUT_ID_MAX)
		{
			__u8 c = s[(v + 1 + j) & GT_SCRATCH_MASK];
			if (v + 1 + j >= n || c == '\\')
				break;
			if (c == '"') {
				closed = 1;
				break;
			}
			ev->rollout.id[j & (GT_ROLLOUT_ID_MAX - 1)] = c;
			ev->rollout.id_len = j + 1;
		}
		if (!closed) {
			ev->rollout.id_len = 0; // cut by the read, or escaped: not found
			return 0;
		}
	} else {
		return 0;
	}
	ev->flags |= GT_F_ROLLOUT;
	return 0;
}

// Scans one body buffer of a /run request for Gym's rollout keys
// ("_ng_task_index", "_ng_rollout_index", "_ng_attempt_index",
// "_ng_rollout_id") and keeps only their values. No other body byte is kept.
GT_GLOBAL int gt_scan_rollout(struct http_event *ev, __u64 ubuf, __u32 len)
{
#ifdef GT_K510
	return gt_k510_scan_rollout(ubuf, len); // ev is c->req: k510_wrap.h finds it
#endif
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc || !ev)
		return 0;
	int w;
	gt_for(w, 0, GT_ROLLOUT_WINDOWS)
	{
		__u32 off;
		int got = gt_read_window(sc, ubuf, len, w, GT_ROLLOUT_WINDOWS, GT_ROLLOUT_WINDOWS / 2, &off);
		if (got <= 0)
			break;
		__u32 n = got;
		struct gt_rollout_ctx cx = {.sc = sc, .ev = ev, .n = n};
		gt_loop((int)n, gt_rollout_at, &cx);
	}
	return 0;
}
