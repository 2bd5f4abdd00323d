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

// A pair is proven, never guessed: a client request and a server request are
// the same request only when one of these says so, and their methods and
// paths agree. Anything else stays unjoined and is counted (a wrong parent is
// worse than a missing one). Neither proof depends on the order in which the
// two ends' records arrive, nor on timestamps, nor on every record arriving:
// a lost record leaves its own request unjoined and shifts no other pair.
type proof uint8

const (
	proofNone proof = iota
	// Both kernels read where the request starts in the connection's TCP
	// stream (http.Exchange.StreamSeq): the same number is the same
	// request, on a connection followed from its first byte or picked up
	// mid-stream alike. A request gymtrace injected a traceparent into is
	// longer on the wire than its writer wrote it, so its client-side
	// position is off; it, and the later requests on its connection, pair
	// by the traceparent it carries instead (injectedPair).
	proofStream
	// Without stream positions (TLS plaintext): both ends followed the
	// connection from its first byte (loader.FlagFresh) and neither lost
	// its framing since (loader.FlagGap): then the kernel's request index
	// on the connection (http.Exchange.Seq) is the same on both ends.
	proofIndex
)

// proofOf says how client request c and server request s can be proven to be
// the same request.
func proofOf(c, s *http.Exchange) proof {
	switch {
	case c.HasStreamSeq && s.HasStreamSeq:
		if c.ReqFlags&loader.FlagInjected != 0 {
			return proofNone
		}
		return proofStream
	case c.ReqFlags&s.ReqFlags&loader.FlagFresh != 0 && !c.Gap && !s.Gap:
		return proofIndex
	}
	return proofNone
}

// samePair reports whether client request c is proven to have sent server
// request s.
func samePair(c, s *http.Exchange) bool {
	if c.Method != s.Method || c.Path != s.Path {
		return false
	}
	switch proofOf(c, s) {
	case proofStream:
		return c.StreamSeq == s.StreamSeq
	case proofIndex:
		return c.Seq == s.Seq
	}
	return false
}

// countPair counts a proven pair by its proof.
func (b *Builder) countPair(c, s *http.Exchange) {
	if proofOf(c, s) == proofStream {
		b.st.JoinedStream++
	} else {
		b.st.JoinedIndex++
	}
}

func (b *Builder) joinServer(k tupleKey, in *inbound) {
	q := b.tuples[k]
	if q == nil {
		q = &joinQueue{}
		b.tuples[k] = q
	} else {
		for i, c := range q.clients {
			if !samePair(c.x, in.x) {
				continue // another request on the connection, or no proof
			}
			b.countPair(c.x, in.x)
			q.clients = slices.Delete(q.clients, i, i+1)
			c.queued = false
			in.via = c
			b.dropEmpty(k, q)
			return
		}
	}
	in.waiting = true
	q.servers = append(q.servers, in)
	b.boundQueue(k, q)
}

func (b *Builder) joinClient(k tupleKey, out *outbound) {
	b.notePair(k)
	q := b.tuples[k]
	if q == nil {
		q = &joinQueue{}
		b.tuples[k] = q
	} else {
		for i, s := range q.servers {
			if !samePair(out.x, s.x) {
				continue
			}
			b.countPair(out.x, s.x)
			q.servers = slices.Delete(q.servers, i, i+1)
			s.waiting = false
			b.lateJoin(s, out)
			b.dropEmpty(k, q)
			return
		}
	}
	out.queued = true
	q.clients = append(q.clients, out)
	b.boundQueue(k, q)
}

// maxQueued bounds each side of one connection's join queue. Entries leave
// when their exchange ends, so a queue this long is a connection whose
// records cannot pair (no proof): the oldest is dropped from it, unjoined.
const maxQueued = 64

func (b *Builder) boundQueue(k tupleKey, q *joinQueue) {
	for len(q.clients) > maxQueued {
		q.clients[0].queued = false
		q.clients = slices.Delete(q.clients, 0, 1)
		b.st.JoinUnprovable++
	}
	for len(q.servers) > maxQueued {
		s := q.servers[0]
		q.servers = slices.Delete(q.servers, 0, 1)
		s.waiting = false
		b.st.JoinUnprovable++
		b.emitLate(s)
	}
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
	if b.Mask()&groups.HTTPClient.Mask() == 0 {
		return false // the kernel's gate drops every client record: none can come
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
