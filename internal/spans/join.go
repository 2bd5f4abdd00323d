//go:build linux

package spans

import (
	"net/netip"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Joins across processes on this node: a server request to the client
// request that sent it, by the connection's 4-tuple.

// tupleKey names a TCP connection from the client's side: a client's
// (local, remote) equals the server's (remote, local).
type tupleKey struct{ client, server netip.AddrPort }

// joinQueue holds, for one connection, the client requests whose server has
// not been seen yet and the server requests whose client has not been seen
// yet (the ring buffer normally delivers the client's record first).
type joinQueue struct {
	clients []*outbound
	servers []*inbound
}

// joinSlack absorbs the order in which the two ends' syscalls return: both
// timestamps are taken at syscall exit, so the reader's read can return
// before the writer's write does: by tens of microseconds usually, by
// milliseconds when the woken reader preempts the writer on a busy machine.
// The timing test is only a guard for connections picked up mid-stream
// (inOrder).
const joinSlack = uint64(2 * time.Millisecond)

// inOrder reports whether client request c and server request s come from a
// connection the kernel followed from its first byte on both ends
// (loader.FlagFresh): then each end's k-th request is the other's k-th, in
// the queue's order, and no timestamp can contradict that. (HTTP/1.1 clients
// write request k+1 after reading response k, and both ends' exchange k has
// left the queue by then, so a lost record does not shift the pairing.)
func inOrder(c, s *http.Exchange) bool {
	return c.ReqFlags&s.ReqFlags&loader.FlagFresh != 0
}

func (b *Builder) joinServer(k tupleKey, in *inbound) {
	q := b.tuples[k]
	if q != nil {
		for len(q.clients) > 0 {
			c := q.clients[0]
			// A client that started writing after this request was fully
			// read cannot have sent it: leave it for the next request.
			if c.x.ReqStart > in.x.ReqEnd+joinSlack && !inOrder(c.x, in.x) {
				break
			}
			q.clients[0] = nil
			q.clients = q.clients[1:]
			c.queued = false
			in.via = c
			b.dropEmpty(k, q)
			return
		}
	} else {
		q = &joinQueue{}
		b.tuples[k] = q
	}
	in.waiting = true
	q.servers = append(q.servers, in)
}

func (b *Builder) joinClient(k tupleKey, out *outbound) {
	b.notePair(k)
	q := b.tuples[k]
	if q != nil {
		for len(q.servers) > 0 {
			s := q.servers[0]
			q.servers[0] = nil
			q.servers = q.servers[1:]
			s.waiting = false
			// A server request fully read before this client began writing
			// was sent by an earlier, unseen client request.
			if s.x.ReqEnd+joinSlack < out.x.ReqStart && !inOrder(out.x, s.x) {
				b.emitLate(s)
				continue
			}
			b.lateJoin(s, out)
			b.dropEmpty(k, q)
			return
		}
	} else {
		q = &joinQueue{}
		b.tuples[k] = q
	}
	out.queued = true
	q.clients = append(q.clients, out)
}

// lateJoin links a server request to the client request that sent it when the
// client's record came second (the two sides' records raced across CPUs).
func (b *Builder) lateJoin(s *inbound, out *outbound) {
	defer b.emitLate(s) // a finished request that waited for this record (awaitClient)
	s.via = out
	if s.rollout == "" {
		s.rollout = out.rollout
	}
	b.inferFromCaller(s)
	if s.server == nil || s.hasTP || out.client == nil || s.server.parent != nil || s.server.frozen {
		return
	}
	s.server.parent = out.client
	b.st.JoinedTuple++
	b.st.LateJoins++
	if s.done {
		b.st.JoinedAfterEnd++
		return // the deferred emitLate sends it, joined
	}
	if s.pub {
		// Its calls must carry the trace it now belongs to. A call made
		// before this (unlikely: the join comes microseconds after the
		// request, a handler's first call milliseconds) keeps the old one.
		b.st.Retraced++
		b.publish(s)
	}
}

func (b *Builder) dropEmpty(k tupleKey, q *joinQueue) {
	if len(q.clients) == 0 && len(q.servers) == 0 {
		delete(b.tuples, k)
	}
}

func removeFrom[T comparable](s []T, v T) []T {
	for i, e := range s {
		if e == v {
			copy(s[i:], s[i+1:])
			var zero T
			s[len(s)-1] = zero
			return s[:len(s)-1]
		}
	}
	return s
}

// A server request can end before the record of the client request that
// sent it arrives: the client's program took its timestamp first but
// reserved its record last (its vCPU was preempted, or an interrupt ran),
// while the server read, answered and wrote on the other CPU. On a connection
// whose client is traced here (a client record was seen on it before, or it
// is a new loopback connection), the finished request waits for that record,
// at most lateJoinGrace, before its spans go out unjoined.
const (
	lateJoinGrace  = uint64(100 * time.Millisecond)
	maxLateServers = 4096
	maxPairs       = 1 << 16
)

type lateServer struct {
	in       *inbound
	deadline uint64
}

// notePair records that connection k has a traced client on this node.
func (b *Builder) notePair(k tupleKey) {
	if b.pairs == nil || len(b.pairs) >= maxPairs {
		b.pairs = make(map[tupleKey]struct{}) // forget old connections wholesale: the cost is a missed wait
	}
	b.pairs[k] = struct{}{}
}

// awaitClient keeps finished server request in (still in its connection's
// queue) for its client's record, when one can come and can still change
// its span. Reports whether it did.
func (b *Builder) awaitClient(in *inbound) bool {
	k := tupleKey{client: in.x.Remote, server: in.x.Local}
	if in.server == nil || in.hasTP || in.server.parent != nil || in.server.frozen {
		return false
	}
	if _, paired := b.pairs[k]; !paired {
		// No client record on this connection yet. A new loopback
		// connection's first request waits too: its client is on this
		// node, and may be traced (an untraced one costs this span the
		// grace in latency, once per connection).
		if in.x.ReqFlags&loader.FlagFresh == 0 || !in.x.Remote.Addr().Unmap().IsLoopback() {
			return false
		}
	}
	if b.role(in.proc, in.x) == groups.RoleUnknown && roleSensitive(in.x.Method, in.x.Path) {
		return false // its name may still change with its role: not kept twice
	}
	if len(b.late) >= maxLateServers {
		b.expireLate(0, maxLateServers/2) // the oldest half out unjoined: bounded memory
	}
	in.done = true
	b.late = append(b.late, lateServer{in: in, deadline: b.opt.Clock.NowMono() + lateJoinGrace})
	b.st.AwaitedClient++
	return true
}

// emitLate returns the spans of a finished server request that was waiting
// for its client (joined now, or given up on); no-op for one still in flight.
func (b *Builder) emitLate(in *inbound) {
	if !in.done {
		return
	}
	in.done, in.waiting = false, false
	b.emitServer(in)
}

// expireLate gives up on the waits past their deadline, and on the oldest
// force ones whatever their deadline: the spans go out unjoined, and leave
// their connection's queue.
func (b *Builder) expireLate(now uint64, force int) {
	n := 0
	for n < len(b.late) && (b.late[n].deadline <= now || n < force) {
		in := b.late[n].in
		b.late[n] = lateServer{}
		n++
		if !in.done {
			continue // joined meanwhile
		}
		k := tupleKey{client: in.x.Remote, server: in.x.Local}
		if q := b.tuples[k]; q != nil {
			q.servers = removeFrom(q.servers, in)
			b.dropEmpty(k, q)
		}
		b.emitLate(in)
	}
	b.late = b.late[n:]
}
