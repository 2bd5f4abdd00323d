//go:build linux

package spans

import (
	"net/netip"
	"slices"
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

// byStream reports whether client request c and server request s pair by
// stream position: both kernels read where the request starts in the
// connection's TCP stream (http.Exchange.StreamSeq), and the connection was
// picked up mid-stream (on one followed from its first byte on both ends,
// queue order is exact already: inOrder). Then equal positions are the same
// request and nothing else is, whatever order the records came in and
// however far apart the two ends' syscalls returned. A request gymtrace
// injected a traceparent into is longer on the wire than the client wrote it,
// so its client-side position is off: it pairs by order and time (and
// carries the trace in-band anyway).
func byStream(c, s *http.Exchange) bool {
	return c.HasStreamSeq && s.HasStreamSeq && c.ReqFlags&loader.FlagInjected == 0 && !inOrder(c, s)
}

// sentBy reports whether the oldest queued client request c can have sent
// server request s when the stream cannot say: a client that started writing
// after s was fully read cannot, unless both ends were followed from the
// first byte (inOrder).
func sentBy(c, s *http.Exchange) bool {
	return c.ReqStart <= s.ReqEnd+joinSlack || inOrder(c, s)
}

// countStream counts a pair made by stream position, and whether order and
// time alone would have refused it (what a loaded machine does to a
// connection picked up mid-stream).
func (b *Builder) countStream(c, s *http.Exchange) {
	b.st.JoinedStream++
	if !sentBy(c, s) {
		b.st.StreamPastGuard++
	}
}

func (b *Builder) joinServer(k tupleKey, in *inbound) {
	q := b.tuples[k]
	if q == nil {
		q = &joinQueue{}
		b.tuples[k] = q
	} else {
		for i, c := range q.clients {
			if byStream(c.x, in.x) {
				if c.x.StreamSeq != in.x.StreamSeq {
					continue // another request on the connection
				}
				b.countStream(c.x, in.x)
			} else if i > 0 || !sentBy(c.x, in.x) {
				break // leave it for the next request
			}
			q.clients = slices.Delete(q.clients, i, i+1)
			c.queued = false
			in.via = c
			b.dropEmpty(k, q)
			return
		}
	}
	in.waiting = true
	q.servers = append(q.servers, in)
}

func (b *Builder) joinClient(k tupleKey, out *outbound) {
	b.notePair(k)
	q := b.tuples[k]
	if q == nil {
		q = &joinQueue{}
		b.tuples[k] = q
	} else {
		for i := 0; i < len(q.servers); {
			s := q.servers[i]
			if byStream(out.x, s.x) {
				if out.x.StreamSeq != s.x.StreamSeq {
					i++
					continue
				}
				b.countStream(out.x, s.x)
			} else if i > 0 {
				break
			} else if !sentBy(out.x, s.x) {
				// Fully read before this client began writing: sent by an
				// earlier, unseen client request.
				q.servers = slices.Delete(q.servers, 0, 1)
				s.waiting = false
				b.emitLate(s)
				continue
			}
			q.servers = slices.Delete(q.servers, i, i+1)
			s.waiting = false
			b.lateJoin(s, out)
			b.dropEmpty(k, q)
			return
		}
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
// whose client is traced here (a client record was seen on it before), or
// may be (a loopback connection no wait on has yet given up on: new, or
// picked up mid-stream when gymtrace attached to a running stack), the
// finished request waits for that record, at most lateJoinGrace, before its
// spans go out unjoined. A wait that gives up marks the connection lonely:
// its client is not traced, and its later requests do not wait.
//
// The grace is kernel time, not the agent's: a wait ends once the agent has
// read records stamped lateJoinGrace after the server's answer (the client's
// record was reserved by then unless its writer stalled that long inside
// the syscall), so an agent that falls behind the ring on a loaded machine
// does not give up on records it has not read yet. Without newer records (a
// quiet node) a wait ends after lateIdleGrace of the agent's time, which is
// also how far the agent may fall behind before a wait gives up regardless.
// Waits are checked as records are read, and at the export tick (1 s).
const (
	lateJoinGrace  = uint64(100 * time.Millisecond)
	lateIdleGrace  = uint64(time.Second)
	maxLateServers = 4096
	maxPairs       = 1 << 16
)

type lateServer struct {
	in       *inbound
	deadline uint64 // kernel time: the server's answer plus lateJoinGrace
	since    uint64 // agent time the wait began
}

// noteTime advances the newest kernel timestamp read so far (expireLate).
func (b *Builder) noteTime(t uint64) {
	if t > b.watermark {
		b.watermark = t
	}
}

// notePair records that connection k has a traced client on this node.
func (b *Builder) notePair(k tupleKey) {
	if b.pairs == nil || len(b.pairs) >= maxPairs {
		b.pairs = make(map[tupleKey]struct{}) // forget old connections wholesale: the cost is a missed wait
	}
	b.pairs[k] = struct{}{}
}

// noteLonely records that a wait on connection k gave up: no traced client.
func (b *Builder) noteLonely(k tupleKey) {
	if b.lonely == nil || len(b.lonely) >= maxPairs {
		b.lonely = make(map[tupleKey]struct{}) // forget wholesale: the cost is one more wait per connection
	}
	b.lonely[k] = struct{}{}
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
		// No client record on this connection yet. On loopback the client
		// is on this node, and may be traced: the request waits unless a
		// wait on this connection gave up before (an untraced client costs
		// one span the grace in latency, once per connection). It must be
		// able to pair late: a connection followed from its first byte, or
		// a request whose stream position the kernel read (picked up
		// mid-stream, the order of the two ends' requests is unknown).
		_, lonely := b.lonely[k]
		if lonely || !in.x.Remote.Addr().Unmap().IsLoopback() ||
			in.x.ReqFlags&loader.FlagFresh == 0 && !in.x.HasStreamSeq {
			return false
		}
	}
	if b.role(in.proc, in.x) == groups.RoleUnknown && roleSensitive(in.x.Method, in.x.Path) {
		return false // its name may still change with its role: not kept twice
	}
	if len(b.late) >= maxLateServers {
		b.expireLate(b.opt.Clock.NowMono(), maxLateServers/2) // the oldest half out unjoined: bounded memory
	}
	in.done = true
	b.late = append(b.late, lateServer{in: in, deadline: in.x.RespEnd + lateJoinGrace, since: b.opt.Clock.NowMono()})
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

// expireLate gives up on the waits past their deadline (agent time now),
// and on the oldest force ones whatever their deadline: the spans go out
// unjoined, and leave their connection's queue.
func (b *Builder) expireLate(now uint64, force int) {
	n := 0
	for n < len(b.late) && (n < force || b.late[n].deadline <= b.watermark || now >= b.late[n].since+lateIdleGrace) {
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
		if _, paired := b.pairs[k]; !paired {
			b.noteLonely(k)
		}
		b.st.LateExpired++
		b.emitLate(in)
	}
	b.late = b.late[n:]
}
