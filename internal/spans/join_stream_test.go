//go:build linux

package spans

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// serverJoins counts the SERVER spans whose parent is a CLIENT span.
func serverJoins(spans []Span) (joined, servers int) {
	for _, sp := range spans {
		if sp.Kind == trace.SpanKindServer {
			servers++
			if p := findByID(spans, sp.Parent); p != nil && p.Kind == trace.SpanKindClient {
				joined++
			}
		}
	}
	return joined, servers
}

// A connection picked up mid-stream (gymtrace attached to a running stack
// whose keep-alive connections already exist: no FlagFresh) on a busy
// machine: the server read the request 20 ms before the client's write
// returned. The timing guard alone refuses that pair (TestJoinWhenTheWriterReturnsLate);
// with the stream positions both kernels read, the pair is exact.
func TestJoinByStreamPositionMidStream(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.lateCli, s.cliLag = true, uint64(20*time.Millisecond)
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/get_weather", withStream(1000)).respond(200)
	c.request(loader.MethodPOST, "/verify", withStream(1300)).respond(200)
	if joined, servers := serverJoins(s.spans); servers != 2 || joined != 2 {
		t.Errorf("%d of %d server spans joined to their client span, want 2 of 2", joined, servers)
	}
	if st := s.b.Stats(); st.JoinedStream != 2 {
		t.Errorf("JoinedStream = %d, want 2", st.JoinedStream)
	}
}

// The oldest queued client request is not always the sender: one whose
// server record never came (attached mid-request, or lost) sits at the head.
// By order the next server request would pair with it, wrongly; by stream
// position it pairs with its own.
func TestStreamPositionSkipsAnOrphanClient(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	s.traced[pidResources] = false
	orphan := c.request(loader.MethodPOST, "/orphan", withStream(500))
	s.traced[pidResources] = true
	s.lateCli = true // the server's record first: it finds the orphan queued
	c.request(loader.MethodPOST, "/verify", withStream(900)).respond(200)
	s.traced[pidResources] = false
	orphan.respond(200)
	got := edges(t, s.spans)
	diffEdges(t, got, []string{
		e("simple_agent:HTTP POST ->resources/orphan", ""),
		e("simple_agent:HTTP POST ->resources/verify", ""),
		e("weather:POST /verify", "simple_agent:HTTP POST ->resources/verify"),
	})
}

// Positions that differ never pair, whatever the timing or the order says, on
// a connection picked up mid-stream and on one both ends followed from its
// first byte alike: the server request waits for its own client (and,
// finished, goes out unjoined).
func TestStreamPositionsThatDiffer(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		s := newSim(t, "server,http_client")
		c := s.dial(pidAgent, pidResources, resAddr)
		k := c.request(loader.MethodPOST, "/verify", func(ev *loader.HTTPEvent) {
			pos := uint32(100)
			if ev.Side == loader.SideServer {
				pos = 200
			}
			withStream(pos)(ev)
			if fresh {
				ev.Flags |= loader.FlagFresh
			}
		})
		k.respond(200)
		s.spans = append(s.spans, s.p.Flush()...)
		if joined, servers := serverJoins(s.spans); servers != 1 || joined != 0 {
			t.Errorf("fresh=%v: %d of %d server spans joined, want 0 of 1", fresh, joined, servers)
		}
	}
}

// The client's record after the server's whole exchange, on a connection
// picked up mid-stream: the finished request waits and joins. A connection
// whose client is not traced waits once: the wait that gives up marks it,
// and its next requests go out at once.
func TestLateClientRecordMidStream(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.cliLast = true
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", withStream(7)).respond(200)
	s.spans = append(s.spans, s.p.Flush()...)
	if joined, servers := serverJoins(s.spans); servers != 1 || joined != 1 {
		t.Errorf("%d of %d server spans joined, want 1 of 1", joined, servers)
	}
	if st := s.b.Stats(); st.AwaitedClient != 1 || st.JoinedAfterEnd != 1 || st.JoinedStream != 1 {
		t.Errorf("awaited %d, joined after the end %d, by stream %d; want 1, 1, 1", st.AwaitedClient, st.JoinedAfterEnd, st.JoinedStream)
	}

	s2 := newSim(t, "server,http_client")
	s2.traced[pidAgent] = false
	c := s2.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/verify", withStream(7)).respond(200)
	if n := len(s2.spans); n != 0 {
		t.Fatalf("%d spans out before the wait ended, want 0", n)
	}
	s2.b.mu.Lock()
	s2.b.expireLate(^uint64(0), 0) // the grace is over
	s2.b.mu.Unlock()
	s2.spans = append(s2.spans, s2.b.Take()...)
	c.request(loader.MethodPOST, "/verify", withStream(300)).respond(200)
	if n := len(findSpans(s2.spans, "POST /verify")); n != 2 {
		t.Errorf("%d server spans out, want both: the second must not wait", n)
	}
	if st := s2.b.Stats(); st.AwaitedClient != 1 || st.LateExpired != 1 {
		t.Errorf("awaited %d, expired %d; want 1 and 1", st.AwaitedClient, st.LateExpired)
	}
}

// A wait for a client's record ends on kernel time: once records stamped
// lateJoinGrace after the server's answer were read. An agent that was
// descheduled past the grace (a loaded machine) does not give up on a record
// it has not read yet; a quiet node ends the wait after lateIdleGrace.
func TestLateWaitFollowsKernelTime(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.b.opt.Clock = stoppedClock{s.b.opt.Clock}
	s.traced[pidAgent] = false // no client record will come
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", withStream(7)).respond(200)
	if len(s.b.late) != 1 {
		t.Fatalf("%d waits, want 1", len(s.b.late))
	}
	s.b.mu.Lock()
	since := s.b.late[0].since
	// The agent ran past the grace on its own clock; nothing newer was read.
	s.b.expireLate(since+lateJoinGrace+(lateIdleGrace-lateJoinGrace)/2, 0)
	waiting := len(s.b.late)
	s.b.mu.Unlock()
	if waiting != 1 {
		t.Fatal("the wait ended on agent time alone, before newer records were read")
	}
	s.now += uint64(200 * time.Millisecond) // later records: past the answer plus the grace
	s.traced[pidAgent] = true
	s.dial(pidAgent, pidModel, modelAddr).request(loader.MethodPOST, "/v1/responses").respond(200)
	s.spans = append(s.spans, s.b.Take()...)
	if st := s.b.Stats(); st.LateExpired != 1 || len(findSpans(s.spans, "POST /verify")) != 1 {
		t.Errorf("expired %d, /verify spans out %d; want 1 and 1", st.LateExpired, len(findSpans(s.spans, "POST /verify")))
	}

	// A quiet node: no newer record, the agent's clock ends it.
	q := newSim(t, "server,http_client")
	q.b.opt.Clock = stoppedClock{q.b.opt.Clock}
	q.traced[pidAgent] = false
	q.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", withStream(7)).respond(200)
	q.b.mu.Lock()
	q.b.expireLate(q.b.late[0].since+lateIdleGrace, 0)
	left := len(q.b.late)
	q.b.mu.Unlock()
	if left != 0 {
		t.Error("a wait on a quiet node outlived lateIdleGrace")
	}
}

// The waits are bounded: past maxLateServers the oldest half goes out
// unjoined, and only that half.
func TestLateWaitsBounded(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.b.opt.Clock = stoppedClock{s.b.opt.Clock} // no wait ends on the agent's clock mid-test
	s.traced[pidAgent] = false
	for range maxLateServers + 1 {
		s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", withStream(7)).respond(200)
	}
	if st := s.b.Stats(); st.LateExpired != maxLateServers/2 || len(s.b.late) != maxLateServers/2+1 {
		t.Errorf("expired %d, still waiting %d; want %d and %d", st.LateExpired, len(s.b.late), maxLateServers/2, maxLateServers/2+1)
	}
}

// stoppedClock is a Clock whose NowMono stands still.
type stoppedClock struct{ Clock }

func (stoppedClock) NowMono() uint64 { return uint64(time.Hour) }

// A record lost between the two ends (the ring buffer was full) on a
// connection both ends followed from its first byte: the next server request
// must not take the next client request for its own. Queue order did (issue:
// "every later request on that connection is joined to the wrong CLIENT
// span"); the request index does not.
func TestLostClientRecordShiftsNoJoin(t *testing.T) {
	for _, stream := range []bool{false, true} {
		s := newSim(t, "server,http_client")
		c := s.dial(pidAgent, pidResources, resAddr)
		pos := uint32(1000)
		req := func(path string) *call {
			var opts []reqOpt
			if stream {
				opts = append(opts, withStream(pos))
				pos += 300
			}
			return c.request(loader.MethodPOST, path, opts...)
		}
		req("/seed_session").respond(200)
		s.traced[pidAgent] = false // the client's records of the next exchange are lost
		lost := req("/get_weather")
		s.traced[pidAgent] = true
		s.lateCli = true // the server's record of the next request first: it finds nothing queued
		next := req("/get_weather")
		s.lateCli = false
		s.traced[pidAgent] = false
		lost.respond(200)
		s.traced[pidAgent] = true
		next.respond(200)
		req("/verify").respond(200)
		s.spans = append(s.spans, s.p.Flush()...)
		diffEdges(t, edges(t, s.spans), []string{
			e("simple_agent:HTTP POST ->resources/seed_session", ""),
			e("weather:POST /seed_session", "simple_agent:HTTP POST ->resources/seed_session"),
			e("weather:POST /get_weather", ""),
			e("simple_agent:HTTP POST ->resources/get_weather", ""),
			e("weather:POST /get_weather", "simple_agent:HTTP POST ->resources/get_weather"),
			e("simple_agent:HTTP POST ->resources/verify", ""),
			e("weather:POST /verify", "simple_agent:HTTP POST ->resources/verify"),
		})
	}
}

// Equal stream positions with another method or path are not a pair: a
// server request is never joined to a client request it cannot be.
func TestJoinNeedsSameMethodAndPath(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/verify", func(ev *loader.HTTPEvent) {
		withStream(7)(ev)
		if ev.Side == loader.SideServer {
			ev.PathLen = uint16(copy(ev.Path[:], "/seed_session"))
		}
	}).respond(200)
	s.spans = append(s.spans, s.p.Flush()...)
	if joined, servers := serverJoins(s.spans); servers != 1 || joined != 0 {
		t.Errorf("%d of %d server spans joined across different paths, want 0 of 1", joined, servers)
	}
}
