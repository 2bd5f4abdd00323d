// Chunked transfer coding: the size lines, data and final CRLF of a chunked
// body, followed across a user buffer (and across syscalls, by the direction's
// chunk_phase and remaining). Included by bpf/message.h, whose gt_step calls it.
#pragma once

// Follows chunked framing from off. Returns the new offset, or -1 when
// framing was lost.
GT_GLOBAL int gt_chunks(struct gt_conn *c, struct gt_io *io, __u64 ubuf, __u32 off, __u32 len)
{
	if (!c || !io)
		return -1;
	struct gt_dir *d = &c->dir[io->dir & 1];
	struct gt_scratch *sc = gt_get_scratch();
	if (!sc)
		return -1;
	sc->loops.chunk_off = off;
	sc->loops.chunk_err = 0;
	sc->loops.ga_len = 0;
	int k;
	gt_for(k, 0, GT_MAX_CHUNKS_PER_BUF)
	{
		__u32 o = sc->loops.chunk_off;
		if (o >= len || d->phase != GT_PH_CHUNKED)
			break;
		__u32 avail = len - o;
		if (d->chunk_phase != GT_CH_SIZE) {
			__u64 rem = d->remaining;
			__u64 take = rem < avail ? rem : avail;
			d->remaining = rem - take;
			sc->loops.chunk_off = o + take;
			if (d->chunk_phase == GT_CH_DATA) {
				d->body_len += take;
				// The chunk's data, without the CRLF that ends it: a
				// model exchange's is walked by gt_step, next, so the
				// walk's frames are not under this one's.
				__u64 data = rem > 2 ? rem - 2 : 0;
				if (data > take)
					data = take;
				if (d->scan_genai && data) {
					sc->loops.ga_ubuf = ubuf + o;
					sc->loops.ga_len = (__u32)data;
					if (d->remaining == 0)
						d->chunk_phase = GT_CH_SIZE, d->body_len -= 2;
					break;
				}
			}
			if (d->remaining)
				continue;
			if (d->chunk_phase == GT_CH_LAST) {
				if (d->scan_genai)
					gt_genai_end(c, io, io->dir); // before the record it belongs to
				gt_finish(c, d, io, GT_F_CHUNKED);
				break;
			}
			d->body_len -= 2; // the CRLF after each chunk's data is framing
			d->chunk_phase = GT_CH_SIZE;
			continue;
		}
		// The chunk-size line, parsed with its state in map memory.
		__u32 n = avail < GT_PEEK ? avail : GT_PEEK;
		if (bpf_probe_read_user(sc->loops.line, n & 31, (void *)(ubuf + o)))
			return -1;
		sc->loops.csize = 0;
		sc->loops.cnl = -1;
		sc->loops.cdigits = 0;
		sc->loops.cext = 0;
		if (d->size_part) {
			// The line began at the end of the previous buffer.
			sc->loops.csize = d->size_acc;
			sc->loops.cdigits = d->size_part - 1;
			sc->loops.cext = d->size_ext;
			d->size_part = 0;
		}
		int j;
		gt_for(j, 0, GT_PEEK)
		{
			if (j >= n)
				break;
			__u8 ch = sc->loops.line[j & (GT_PEEK - 1)];
			if (ch == '\n') {
				sc->loops.cnl = j;
				break;
			}
			if (sc->loops.cext || ch == '\r')
				continue;
			if (ch == ';') {
				sc->loops.cext = 1;
				continue;
			}
			__u8 lc = ch | 0x20;
			__u8 v;
			if (ch >= '0' && ch <= '9')
				v = ch - '0';
			else if (lc >= 'a' && lc <= 'f')
				v = lc - 'a' + 10;
			else {
				sc->loops.cdigits = 0; // not a size line (the error below)
				break;
			}
			sc->loops.csize = (sc->loops.csize << 4) | v;
			sc->loops.cdigits++;
		}
		__s32 nl = sc->loops.cnl;
		__u64 size = sc->loops.csize;
		if (nl < 0 && n == avail && n < GT_PEEK && sc->loops.cdigits && sc->loops.cdigits <= 7) {
			// The buffer ends inside the size line: what it held of it
			// is kept, the next buffer goes on with it (a reader's read
			// of a large chunked body can end anywhere).
			d->size_acc = (__u32)sc->loops.csize;
			d->size_part = sc->loops.cdigits + 1;
			d->size_ext = sc->loops.cext;
			sc->loops.chunk_off = len;
			return len;
		}
		if (nl < 0 || !sc->loops.cdigits) {
			// A size line longer than GT_PEEK, or not chunked framing
			// after all: framing is lost here. The caller looks for a
			// message start at this offset.
			gt_stat_add(GT_STAT_PARSE_ERROR, 1);
			sc->loops.chunk_err = 1;
			return sc->loops.chunk_off;
		}
		sc->loops.chunk_off = o + nl + 1;
		if (size == 0) {
			d->chunk_phase = GT_CH_LAST;
			d->remaining = 2; // the final CRLF (trailers are not used by Gym's servers)
		} else {
			d->chunk_phase = GT_CH_DATA;
			d->remaining = size + 2;
		}
	}
	return sc->loops.chunk_off;
}
GT_K510_CI(gt_chunks, (__u64 ubuf, __u32 off, __u32 len), -1, c, io, ubuf, off, len)
#ifdef GT_K510
#define gt_chunks(c, io, ...) gt_chunks_k510(__VA_ARGS__)
#endif
