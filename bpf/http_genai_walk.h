// The JSON walk of bpf/http_genai.h, by part: what a key means where it is,
// values (model strings, token counts), structural bytes, strings, and one
// step of the walk over the scratch (gt_ga_step, a bpf_loop callback). State
// in struct gt_jscan (map memory); only the four values reach struct
// gt_genai. Included by http_genai.h, after its types and maps.
#pragma once

static __always_inline void gt_ga_fail(struct gt_genai *g, __u32 f, __u8 why)
{
	f &= 3;
	g->have &= ~(1 << f);
	if (g->why[f] < why || g->why[f] == GT_GW_NONE)
		g->why[f] = why;
	g->seen |= 1 << f;
}

// What the key just closed means at this depth, for this dialect.
static __always_inline void gt_ga_key(struct gt_genai *g, struct gt_jscan *js, int req)
{
	__u8 n = js->klen & 31, m = js->kmask;
	__u8 ctx = js->ctx[(js->depth - 1) & 3];
	js->pend = GT_GK_NONE;
	// The key whose text ends here too (the table's NUL).
	int id = -1;
#pragma unroll
	for (int i = 0; i < GT_GA_KEYS; i++)
		if (((m >> i) & 1) && gt_ga_keys[i][n & (GT_GA_KEY_LEN - 1)] == 0)
			id = i;
	if (id < 0)
		return;
	if (ctx == GT_GC_ROOT || ctx == GT_GC_WRAP) {
		if (id == GT_KI_MODEL)
			js->pend = GT_GK_MODEL;
		else if (req)
			return; // a request's model only, at its top level
		else if (id == GT_KI_USAGE)
			js->pend = GT_GK_USAGE;
		else if (ctx == GT_GC_ROOT && js->sse &&
			 ((g->dialect == GT_GENAI_RESPONSES && id == GT_KI_RESPONSE) ||
			  (g->dialect == GT_GENAI_MESSAGES && id == GT_KI_MESSAGE)))
			js->pend = GT_GK_WRAP;
		if (req && ctx != GT_GC_ROOT)
			js->pend = GT_GK_NONE;
	} else if (ctx == GT_GC_USAGE || ctx == GT_GC_USAGE_IN) {
		if (g->dialect == GT_GENAI_CHAT) {
			if (id == GT_KI_PROMPT)
				js->pend = GT_GK_IN;
			else if (id == GT_KI_COMPLETION)
				js->pend = GT_GK_OUT;
		} else if (id == GT_KI_INPUT) {
			js->pend = GT_GK_IN;
		} else if (id == GT_KI_OUTPUT) {
			// A message_start's output_tokens is a placeholder: the
			// stream's count is message_delta's, at the top level.
			if (!(g->dialect == GT_GENAI_MESSAGES && js->sse && ctx == GT_GC_USAGE_IN))
				js->pend = GT_GK_OUT;
		}
	}
}

// A value for field f begins: is it the first, or one more?
static __always_inline void gt_ga_value_begin(struct gt_genai *g, struct gt_jscan *js, __u8 f)
{
	js->vfield = f;
	js->vbad = 0;
	js->vcmp = 0;
	if ((g->seen >> (f & 3)) & 1) {
		if (!js->sse) {
			gt_ga_fail(g, f, GT_GW_AMBIGUOUS); // a key twice at its level of one JSON body
			js->vfield = 0xff;
			return;
		}
		if (!((g->have >> (f & 3)) & 1)) {
			js->vfield = 0xff; // an earlier event's was not one: none is sure
			return;
		}
		// SSE: the same model in every event (compared); counts, the last.
		js->vcmp = (f == GT_GA_REQ_MODEL || f == GT_GA_RESP_MODEL) && ((g->have >> (f & 3)) & 1);
	}
	g->seen |= 1 << (f & 3);
}

// A token count's digits ended at a byte that may follow a value (or not).
static __always_inline void gt_ga_int_end(struct gt_genai *g, struct gt_jscan *js, __u8 c)
{
	js->vint = 0;
	__u8 f = js->vfield;
	js->vfield = 0xff;
	if (f > 3)
		return;
	if (!(c == ',' || c == '}' || c == ']' || gt_json_ws(c)) || js->num >= 0x80000000ULL || js->vdigits > 10) {
		gt_ga_fail(g, f, GT_GW_MALFORMED); // a fraction, an exponent, too large
		return;
	}
	g->tok[(f - GT_GA_IN) & 1] = (__u32)js->num;
	g->have |= 1 << f;
	g->why[f & 3] = GT_GW_NONE;
}

// A structural byte (not whitespace, outside strings) of the JSON walk.
// Returns 1 when the walk's JSON value closed with it.
GT_GLOBAL int gt_ga_struct(struct gt_genai *g, __u32 dir, __u8 c)
{
	if (!g)
		return 0;
	struct gt_jscan *js = &g->js[dir & 1];
	if (js->vint) {
		if (c >= '0' && c <= '9') {
			js->num = js->num * 10 + (c - '0');
			js->vdigits++;
			return 0;
		}
		gt_ga_int_end(g, js, c);
	}
	__u8 pend = js->colon ? js->pend : GT_GK_NONE;
	if (js->pend && !js->colon) {
		if (c == ':') {
			js->colon = 1;
			return 0;
		}
		js->pend = GT_GK_NONE; // not a key after all
	}
	js->pend = GT_GK_NONE;
	js->colon = 0;
	__u8 d = js->depth;
	if (c == '{' || c == '[') {
		if (d >= GT_GA_MAX_DEPTH) {
			js->cut = 1; // deeper than the walk follows
			js->mode = GT_JM_DEAD;
			return 0;
		}
		d++;
		js->depth = d;
		if (c == '{')
			js->objmask |= 1ULL << (d & 63);
		else
			js->objmask &= ~(1ULL << (d & 63));
		__u8 nctx = GT_GC_OTHER;
		if (d == 1 && c == '{')
			nctx = GT_GC_ROOT;
		else if (c == '{' && pend == GT_GK_WRAP)
			nctx = GT_GC_WRAP;
		else if (c == '{' && pend == GT_GK_USAGE)
			nctx = d == 2 ? GT_GC_USAGE : GT_GC_USAGE_IN;
		else if (pend == GT_GK_MODEL || pend == GT_GK_IN || pend == GT_GK_OUT)
			gt_ga_fail(g, pend == GT_GK_MODEL ? (dir == 0 ? GT_GA_REQ_MODEL : GT_GA_RESP_MODEL)
							  : pend == GT_GK_IN ? GT_GA_IN : GT_GA_OUT,
				   GT_GW_MALFORMED);
		if (d <= 4)
			js->ctx[(d - 1) & 3] = nctx;
		js->last = c;
		return 0;
	}
	if (c == '}' || c == ']') {
		if (d == 0) {
			js->cut = 1;
			js->mode = GT_JM_DEAD;
			return 0;
		}
		js->depth = d - 1;
		js->last = c;
		return d == 1;
	}
	if (pend == GT_GK_IN || pend == GT_GK_OUT) {
		__u8 f = pend == GT_GK_IN ? GT_GA_IN : GT_GA_OUT;
		if (c >= '0' && c <= '9') {
			gt_ga_value_begin(g, js, f);
			if (js->vfield == f) {
				js->vint = 1;
				js->num = c - '0';
				js->vdigits = 1;
			}
		} else if (c != 'n') { // null: no count here (a stream's usage: null)
			gt_ga_value_begin(g, js, f);
			gt_ga_fail(g, f, GT_GW_MALFORMED);
			js->vfield = 0xff;
		}
	} else if (pend == GT_GK_MODEL && c != 'n') {
		__u8 f = dir == 0 ? GT_GA_REQ_MODEL : GT_GA_RESP_MODEL;
		gt_ga_value_begin(g, js, f);
		gt_ga_fail(g, f, GT_GW_MALFORMED);
		js->vfield = 0xff;
	}
	js->last = c;
	return 0;
}

// A string opens ('"' outside strings): a key whose text is kept, a model
// value, or any other string.
GT_GLOBAL int gt_ga_str_open(struct gt_genai *g, __u32 dir)
{
	if (!g)
		return 0;
	struct gt_jscan *js = &g->js[dir & 1];
	if (js->vint)
		gt_ga_int_end(g, js, '"'); // malformed: a quote right after digits
	js->in_str = 1;
	js->kcap = 0;
	js->vstr = 0;
	__u8 d = js->depth;
	__u8 pend = js->colon ? js->pend : GT_GK_NONE;
	js->pend = GT_GK_NONE;
	js->colon = 0;
	int key = d >= 1 && ((js->objmask >> (d & 63)) & 1) && (js->last == '{' || js->last == ',');
	if (key) {
		__u8 ctx = d <= 4 ? js->ctx[(d - 1) & 3] : GT_GC_OTHER;
		if (ctx != GT_GC_OTHER) {
			js->kcap = 1;
			js->klen = 0;
			js->kmask = (1 << GT_GA_KEYS) - 1;
		}
		return 0;
	}
	if (pend == GT_GK_MODEL) {
		__u8 f = dir == 0 ? GT_GA_REQ_MODEL : GT_GA_RESP_MODEL;
		gt_ga_value_begin(g, js, f);
		if (js->vfield == f) {
			js->vstr = 1;
			js->vlen = 0;
		}
	} else if (pend == GT_GK_IN || pend == GT_GK_OUT) {
		__u8 f = pend == GT_GK_IN ? GT_GA_IN : GT_GA_OUT;
		gt_ga_value_begin(g, js, f);
		gt_ga_fail(g, f, GT_GW_MALFORMED); // a count as a string
		js->vfield = 0xff;
	}
	return 0;
}

// The open string closes.
static __always_inline int gt_ga_str_close(struct gt_genai *g, struct gt_jscan *js, __u32 dir)
{
	js->in_str = 0;
	js->last = '"';
	if (js->kcap) {
		js->kcap = 0;
		gt_ga_key(g, js, dir == 0);
		return 0;
	}
	if (!js->vstr)
		return 0;
	js->vstr = 0;
	__u8 f = js->vfield;
	js->vfield = 0xff;
	if (f > 3)
		return 0;
	__u32 m = f == GT_GA_RESP_MODEL;
	__u16 n = js->vlen;
	if (!js->vbad && (n == 0 || n > GT_MODEL_MAX))
		js->vbad = GT_GW_MALFORMED;
	if (!js->vbad && js->vcmp && n != g->mlen[m])
		js->vbad = GT_GW_AMBIGUOUS;
	if (js->vbad) {
		gt_ga_fail(g, f, js->vbad);
		return 0;
	}
	g->mlen[m] = n;
	g->have |= 1 << f;
	g->why[f & 3] = GT_GW_NONE;
	return 0;
}

// A byte inside a string that may matter: a quote, a backslash, the byte
// after one, or a byte of a key or model name being read. Global: verified
// once, not in every state of the walk.
GT_GLOBAL int gt_ga_str(struct gt_genai *g, __u32 dir, __u8 c)
{
	if (!g)
		return 0;
	struct gt_jscan *js = &g->js[dir & 1];
	if (js->esc) {
		js->esc = 0;
		return 0;
	}
	if (c == '\\') {
		js->esc = 1;
		if (js->kcap)
			js->kmask = 0; // an escaped key is none of ours
		if (js->vstr && !js->vbad)
			js->vbad = GT_GW_MALFORMED; // not recorded: no escapes in a model name
		return 0;
	}
	if (c == '"') {
		gt_ga_str_close(g, js, dir);
		return 0;
	}
	if (js->kcap) {
		__u8 n = js->klen, m = js->kmask;
		if (n >= GT_GA_KEY_LEN - 1) {
			m = 0;
		} else {
			// Branch-free: a branch per key would give the verifier
			// 2^8 paths to walk.
#pragma unroll
			for (int i = 0; i < GT_GA_KEYS; i++)
				m &= ~(((((__u32)(__u8)gt_ga_keys[i][n & (GT_GA_KEY_LEN - 1)] ^ c) + 0xff) >> 8) << i);
		}
		js->kmask = m;
		js->klen = n + 1;
	} else if (js->vstr) {
		__u16 n = js->vlen;
		if (c < 0x20 || c > 0x7e) {
			if (!js->vbad)
				js->vbad = GT_GW_MALFORMED;
		} else if (n < GT_MODEL_MAX) {
			__u32 m = js->vfield == GT_GA_RESP_MODEL;
			__u8 *dst = &g->model[m & 1][n & (GT_MODEL_MAX - 1)];
			if (js->vcmp) {
				if (*dst != c && !js->vbad)
					js->vbad = GT_GW_AMBIGUOUS;
			} else {
				*dst = c;
			}
		}
		if (n <= GT_MODEL_MAX)
			js->vlen = n + 1;
	}
	return 0;
}

struct gt_ga_walk {
	struct gt_genai *g; // the rest is in g (wdir, wn) and the scratch: the frames stay small
};

// Bytes of the walk at js->pos that cannot change its state, taken as a
// run; returns 1 when it took some (js->pos moved), 0 when the byte there
// needs the step. With a bpf_loop callback a byte, kernel time a request was
// 1.44x that with the walk off (bpf_stats, issue 40); runs are cheaper. Boring:
// - inside a string no one reads (not a key of ours, not a model name, no
//   escape pending): any byte but a quote or a backslash, eight at a time
//   where aligned;
// - outside strings, in a container that cannot hold a key of ours
//   (context other, no key pending, no count being read), any byte but a
//   quote or a bracket. There a ',' or ':' would only set last, which
//   matters only where keys are read, and the bracket that leaves the
//   container sets it again.
// A newline is never boring: it ends an SSE event (and a JSON body's
// whitespace newlines are rare; the step takes them).
//
// For the verifier: global (checked once, the step sees one unknown
// result), and the position goes through js->pos (volatile) at every
// iteration, so no register carries a range from one iteration to the
// next and the paths of an iteration meet again at the loop's head: each
// loop is walked once, linearly.
#define GT_GA_WORDS 32 // 256 bytes
#define GT_GA_BYTES 64
#define GT_GA_POS(js) (*(volatile __u32 *)&(js)->pos)
GT_GLOBAL int gt_ga_run(struct gt_genai *g, __u32 dir)
{
	struct gt_scratch *sc = gt_get_scratch();
	if (!g || !sc)
		return 0;
	struct gt_jscan *js = &g->js[dir & 1];
	__u8 mode = js->mode;
	if (js->vint || (mode != GT_JM_JSON && mode != GT_JM_SSE_JSON))
		return 0;
	__u32 n = g->wn, start = GT_GA_POS(js);
	if (js->in_str) {
		if (js->esc || js->kcap || js->vstr)
			return 0;
		for (int j = 0; j < GT_GA_WORDS; j++) {
			__u32 i = GT_GA_POS(js);
			if ((i & 7) || i + 8 > n)
				break;
			__u64 x = *(__u64 *)&sc->buf[i & (GT_SCRATCH - 8)];
			if (GT_HAS_BYTE(x, '"') || GT_HAS_BYTE(x, '\\') || GT_HAS_BYTE(x, '\n'))
				break;
			GT_GA_POS(js) = i + 8;
		}
		for (int j = 0; j < GT_GA_BYTES; j++) {
			__u32 i = GT_GA_POS(js);
			if (i >= n)
				break;
			__u8 c = sc->buf[i & GT_SCRATCH_MASK];
			if (c == '"' || c == '\\' || c == '\n')
				break;
			GT_GA_POS(js) = i + 1;
		}
		return GT_GA_POS(js) != start;
	}
	__u8 d = js->depth;
	if (js->pend || js->colon || d == 0 || (d <= 4 && js->ctx[(d - 1) & 3] != GT_GC_OTHER))
		return 0;
	for (int j = 0; j < GT_GA_BYTES; j++) {
		__u32 i = GT_GA_POS(js);
		if (i >= n)
			break;
		__u8 c = sc->buf[i & GT_SCRATCH_MASK];
		if (c == '"' || c == '{' || c == '}' || c == '[' || c == ']' || c == '\n')
			break;
		GT_GA_POS(js) = i + 1;
	}
	return GT_GA_POS(js) != start;
}

// One step of the walk at js->pos of the window: a run of bytes that cannot
// matter (gt_ga_run), or one byte. 1: the window is done.
GT_LOOP_FN gt_ga_step(int k, struct gt_ga_walk *cx)
{
	struct gt_scratch *sc = gt_get_scratch();
	struct gt_genai *g = cx->g;
	if (!sc)
		return 1;
	__u32 dir = g->wdir & 1;
	struct gt_jscan *js = &g->js[dir];
	__u32 i = js->pos, n = g->wn;
	if (i >= n || js->mode == GT_JM_DEAD)
		return 1;
	if (gt_ga_run(g, dir))
		return 0; // the next step goes on from the run's end
	js->pos = i + 1;
	__u8 c = sc->buf[i & GT_SCRATCH_MASK];
	__u8 mode = js->mode;
	if (mode == GT_JM_JSON || mode == GT_JM_SSE_JSON) {
		if (c == '\n' && mode == GT_JM_SSE_JSON) {
			js->cut = 1; // an event's JSON over several lines: not followed
			js->mode = GT_JM_DEAD;
			return 1;
		}
		if (js->in_str) {
			if (js->esc || js->kcap || js->vstr || c == '"' || c == '\\')
				gt_ga_str(g, dir, c);
			return 0;
		}
		if (gt_json_ws(c)) {
			if (js->vint)
				gt_ga_int_end(g, js, c);
			return 0;
		}
		if (c == '"') {
			gt_ga_str_open(g, dir);
			return 0;
		}
		if (gt_ga_struct(g, dir, c))
			js->mode = mode == GT_JM_JSON ? GT_JM_DONE : GT_JM_SSE_AFTER;
		return 0;
	}
	switch (mode) {
	case GT_JM_START:
		if (gt_json_ws(c))
			return 0;
		if (c == '{') {
			js->mode = GT_JM_JSON;
			gt_ga_struct(g, dir, c);
			return 0;
		}
		if (dir == 1 && (c == 'd' || c == 'e' || c == 'i' || c == 'r' || c == ':')) {
			js->sse = 1;
			js->mode = GT_JM_SSE_LINE;
			js->col = 0;
			js->pos = i; // this byte again, as a line's first
			return 0;
		}
		js->mode = GT_JM_DEAD; // no JSON object: nothing of ours in it
		return 1;
	case GT_JM_DONE:
		if (!gt_json_ws(c)) {
			js->cut = 1;
			js->mode = GT_JM_DEAD;
			return 1;
		}
		return 0;
	case GT_JM_SSE_LINE: {
		const char data[] = "data:";
		__u8 col = js->col;
		if (c == '\n') {
			js->col = 0;
			return 0;
		}
		if (col == 0 && c == '\r')
			return 0;
		if (col < 5 && c == (__u8)data[col & 7]) {
			js->col = col + 1;
			if (col + 1 == 5)
				js->mode = GT_JM_SSE_DATA;
			return 0;
		}
		js->mode = GT_JM_SSE_SKIP;
		return 0;
	}
	case GT_JM_SSE_SKIP:
		if (c == '\n') {
			js->mode = GT_JM_SSE_LINE;
			js->col = 0;
		}
		return 0;
	case GT_JM_SSE_DATA:
		if (c == ' ')
			return 0;
		if (c == '{') {
			// An event's JSON: a value of its own, walked from depth 0.
			js->depth = 0;
			js->objmask = 0;
			js->in_str = 0;
			js->esc = 0;
			js->pend = 0;
			js->colon = 0;
			js->vint = 0;
			js->vstr = 0;
			js->last = 0;
			js->mode = GT_JM_SSE_JSON;
			gt_ga_struct(g, dir, c);
			return 0;
		}
		js->mode = c == '\n' ? GT_JM_SSE_LINE : GT_JM_SSE_SKIP; // [DONE], or a data line not an object
		js->col = 0;
		return 0;
	case GT_JM_SSE_AFTER:
		if (c == '\n') {
			js->mode = GT_JM_SSE_LINE;
			js->col = 0;
		} else if (!gt_json_ws(c)) {
			js->cut = 1;
			js->mode = GT_JM_DEAD;
			return 1;
		}
		return 0;
	}
	return 1;
}
