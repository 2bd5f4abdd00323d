// The part of TLS tracing the syscall programs need: the TLS connection table
// and the link from an SSL* to its socket. The uprobe programs are in tls.h.
//
// An SSL* is tied to its socket by the first write on a socket that the same
// thread makes after an SSL call marked it pending (SSL_do_handshake, or an
// SSL_write on an SSL* not linked yet). That one rule covers both ways
// OpenSSL is driven:
//   - blocking (socket BIO: http.client, requests): the write is nested inside
//     the SSL call;
//   - memory BIOs (asyncio, aiohttp): SSL_* only fills a buffer, and the
//     ciphertext leaves in the socket write the same thread makes right after
//     (sslproto's transport.write).
// Only writes that start with a TLS record header link, so a plaintext HTTP
// connection is never mistaken for the ciphertext; the linked socket is then
// marked GT_CONN_IGNORE and its ciphertext costs one map lookup a syscall.
#pragma once

// Included by syscalls.h after its I/O types (gt_io_kind, gt_iovec, gt_msghdr).

enum gt_tls_state {
	GT_TLS_NONE = 0,     // a plain socket connection (gt_conns)
	GT_TLS_UNLINKED = 1, // plaintext of an SSL*, socket not known yet
	GT_TLS_LINKED = 2,   // ... tuple and fd taken from its socket
};

struct gt_tls_key {
	__u32 tgid;
	__u32 _pad;
	__u64 ssl; // the SSL* in the process's address space
};

// HTTP state of TLS plaintext, per (tgid, SSL*). Same state machine and
// record format as gt_conns; LRU so SSL objects never freed age out.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct gt_tls_key);
	__type(value, struct gt_conn);
} gt_tls_conns SEC(".maps");

struct gt_tls_pending {
	__u64 ssl;
	__u64 ts;
	__u32 tgid;
	__u32 _pad;
};

// Per thread: the SSL* whose socket is the next one this thread writes to.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // tid
	__type(value, struct gt_tls_pending);
} gt_tls_pending SEC(".maps");

// A pending link older than this is stale: the write it waited for went
// elsewhere (a transport that was paused, an SSL call that failed).
#define GT_TLS_LINK_WINDOW_NS (50ULL * 1000 * 1000)

// The first byte a write syscall sends: buf (GT_IO_PLAIN), iov[0].base
// (GT_IO_IOV) or msg->msg_iov[0].base (GT_IO_MSG). 0 when unreadable.
static __always_inline __u64 gt_tls_first_byte_at(int kind, __u64 a1)
{
	if (kind == GT_IO_PLAIN)
		return a1;
	__u64 iov = a1;
	if (kind == GT_IO_MSG) {
		struct gt_msghdr mh = {};
		if (bpf_probe_read_user(&mh, sizeof(mh), (void *)a1) || !mh.iovlen)
			return 0;
		iov = mh.iov;
	}
	struct gt_iovec v = {};
	if (bpf_probe_read_user(&v, sizeof(v), (void *)iov) || !v.len)
		return 0;
	return v.base;
}

// Called by the syscall programs on a socket write of a target, for a
// connection that has not carried HTTP (c->started == 0), before its bytes
// are parsed. kind and a1 describe the syscall's buffer (enum gt_io_kind).
// Returns 1 when the socket was linked to an SSL*: c is now GT_CONN_IGNORE
// and the caller stops.
// A function of its own, off the stack of the parser's deep chain.
GT_GLOBAL int gt_tls_link_write(struct gt_io *io, struct gt_conn *c, int kind, __u64 a1)
{
	if (!io || !c)
		return 0;
	__u32 tgid = io->tgid, tid = io->tid;
	__s32 fd = io->fd;
	__u64 now = io->now;
	struct gt_tls_pending *p = bpf_map_lookup_elem(&gt_tls_pending, &tid);
	if (!p)
		return 0;
	if (p->tgid != tgid || now - p->ts > GT_TLS_LINK_WINDOW_NS) {
		bpf_map_delete_elem(&gt_tls_pending, &tid);
		return 0;
	}
	struct gt_tls_key k = {.tgid = tgid, .ssl = p->ssl};
	__u64 buf = gt_tls_first_byte_at(kind, a1);
	__u8 rec[3] = {};
	// A TLS record: content type 20..23 (change_cipher_spec, alert,
	// handshake, application_data), then version major 3.
	if (!buf || bpf_probe_read_user(rec, sizeof(rec), (void *)buf) || rec[0] < 20 || rec[0] > 23 || rec[1] != 3)
		return 0;
	bpf_map_delete_elem(&gt_tls_pending, &tid);
	struct gt_conn *t = bpf_map_lookup_elem(&gt_tls_conns, &k);
	if (!t)
		return 0;
	t->tuple = c->tuple;
	t->tls_fd = fd;
	t->tls = GT_TLS_LINKED;
	// A request that started before the link keeps its record in the
	// connection state: it gets the tuple too.
	t->req.tuple = c->tuple;
	t->req.fd = fd;
	c->kind = GT_CONN_IGNORE;
	gt_stat_add(GT_STAT_TLS_LINKED, 1);
	return 1;
}

// Flag for every record of a TLS connection (and the count of them).
static __always_inline __u16 gt_tls_ev_flag(const struct gt_conn *c)
{
	if (!c->tls)
		return 0;
	gt_stat_add(GT_STAT_TLS_EVENTS, 1);
	return GT_F_TLS;
}
