//go:build linux

package http

import (
	"errors"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/loader"
)

type recorder struct {
	started []*Exchange
	done    []*Exchange
}

func (r *recorder) RequestStarted(x *Exchange) { r.started = append(r.started, x) }
func (r *recorder) ExchangeDone(x *Exchange)   { r.done = append(r.done, x) }

// reqEv is request seq of connection conn (the kernel's per-connection index);
// respEv answers request seq.
func reqEv(conn, seq uint64, path string, t uint64) *loader.HTTPEvent {
	ev := &loader.HTTPEvent{Kind: loader.EvRequest, Side: loader.SideServer, Method: loader.MethodPOST,
		ConnId: conn, Seq: seq, Pid: 1, StartNs: t, EndNs: t + 1}
	ev.PathLen = uint16(copy(ev.Path[:], path))
	return ev
}

func respEv(conn, seq uint64, status uint16, t uint64, flags uint16) *loader.HTTPEvent {
	return &loader.HTTPEvent{Kind: loader.EvResponse, Side: loader.SideServer, ConnId: conn, Seq: seq,
		Pid: 1, Status: status, StartNs: t, EndNs: t + 1, Flags: flags}
}

func closeEv(conn uint64, t uint64, flags uint16) *loader.HTTPEvent {
	return &loader.HTTPEvent{Kind: loader.EvClose, Side: loader.SideServer, ConnId: conn, Pid: 1,
		StartNs: t, EndNs: t, Flags: flags}
}

func TestAssemblerPipeliningPairsFIFO(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/a", 10), r)
	a.Add(reqEv(1, 1, "/b", 20), r)
	a.Add(reqEv(2, 0, "/other", 25), r) // an interleaved connection must not disturb conn 1
	a.Add(reqEv(1, 2, "/c", 30), r)
	if len(r.started) != 4 || len(r.done) != 0 {
		t.Fatalf("started %d done %d, want 4 and 0", len(r.started), len(r.done))
	}
	a.Add(respEv(1, 0, 200, 40, 0), r)
	a.Add(respEv(1, 1, 404, 50, 0), r)
	a.Add(respEv(2, 0, 201, 55, 0), r)
	a.Add(respEv(1, 2, 500, 60, 0), r)
	want := []struct {
		path   string
		status int
	}{{"/a", 200}, {"/b", 404}, {"/other", 201}, {"/c", 500}}
	if len(r.done) != len(want) {
		t.Fatalf("done %d, want %d", len(r.done), len(want))
	}
	for i, w := range want {
		x := r.done[i]
		if x.Path != w.path || x.Status != w.status || x.Err != nil {
			t.Errorf("exchange %d = %s %d err=%v, want %s %d", i, x.Path, x.Status, x.Err, w.path, w.status)
		}
		if x.RespEnd <= x.ReqEnd {
			t.Errorf("exchange %d: response ends before request", i)
		}
	}
	if s := a.Stats(); s.OpenConns != 0 || s.OpenExchanges != 0 || s.Completed != 4 {
		t.Errorf("stats after all answered: %+v", s)
	}
}

func TestAssemblerCloseWithPending(t *testing.T) {
	for _, c := range []struct {
		flags uint16
		want  error
	}{{0, ErrClosed}, {loader.FlagConnError, ErrConnReset}} {
		a, r := NewAssembler(AssemblerOptions{}), &recorder{}
		a.Add(reqEv(1, 0, "/a", 10), r)
		a.Add(reqEv(1, 1, "/b", 20), r)
		a.Add(respEv(1, 0, 200, 30, 0), r)
		a.Add(closeEv(1, 99, c.flags), r)
		if len(r.done) != 2 {
			t.Fatalf("done %d, want 2", len(r.done))
		}
		x := r.done[1]
		if x.Path != "/b" || !errors.Is(x.Err, c.want) || x.Status != 0 || x.RespEnd != 99 {
			t.Errorf("pending exchange after close = %s status=%d err=%v end=%d", x.Path, x.Status, x.Err, x.RespEnd)
		}
		if s := a.Stats(); s.Failed != 1 || s.OpenConns != 0 {
			t.Errorf("stats: %+v", s)
		}
	}
}

func TestAssemblerResponseFlags(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/a", 10), r)
	a.Add(respEv(1, 0, 200, 20, loader.FlagConnError), r)
	if r.done[0].Err != ErrConnReset || r.done[0].Status != 200 {
		t.Errorf("mid-body reset: err=%v status=%d", r.done[0].Err, r.done[0].Status)
	}
	// A body ended by close ends the connection: a request queued behind it is
	// never answered.
	a.Add(reqEv(2, 0, "/x", 30), r)
	a.Add(reqEv(2, 1, "/y", 31), r)
	a.Add(respEv(2, 0, 200, 40, loader.FlagEndByClose), r)
	if len(r.done) != 3 || r.done[1].Err != nil || r.done[2].Err != ErrClosed {
		t.Fatalf("end-by-close: %d done", len(r.done))
	}
	if a.Stats().OpenConns != 0 {
		t.Error("connection state kept after end-by-close")
	}
}

func TestAssemblerOrphansAndUnknownSide(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(respEv(5, 0, 200, 10, loader.FlagResync), r)
	ev := reqEv(6, 0, "/a", 20)
	ev.Side = loader.SideUnknown
	a.Add(ev, r)
	s := a.Stats()
	if s.OrphanResponses != 1 || s.UnknownSide != 1 || len(r.started) != 0 {
		t.Errorf("stats %+v started %d", s, len(r.started))
	}
}

// Requests beyond MaxPending are dropped: the response of a dropped request
// must not pair with a later one.
func TestAssemblerPendingLimitKeepsPairing(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{MaxPending: 2}), &recorder{}
	a.Add(reqEv(1, 0, "/1", 10), r)
	a.Add(reqEv(1, 1, "/2", 11), r)
	a.Add(reqEv(1, 2, "/3", 12), r) // dropped
	a.Add(respEv(1, 0, 201, 20, 0), r)
	a.Add(reqEv(1, 3, "/4", 21), r)
	a.Add(respEv(1, 1, 202, 22, 0), r)
	a.Add(respEv(1, 2, 203, 23, 0), r) // answers the dropped /3
	a.Add(respEv(1, 3, 204, 24, 0), r)
	got := map[string]int{}
	for _, x := range r.done {
		got[x.Path] = x.Status
	}
	if got["/1"] != 201 || got["/2"] != 202 || got["/4"] != 204 || len(got) != 3 {
		t.Errorf("pairs = %v", got)
	}
	if s := a.Stats(); s.DroppedPendingLimit != 1 || s.OrphanResponses != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestAssemblerConnLimit(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{MaxConns: 2}), &recorder{}
	for i := uint64(1); i <= 3; i++ {
		a.Add(reqEv(i, 0, "/", 10*i), r)
	}
	if s := a.Stats(); s.DroppedConnLimit != 1 || s.OpenConns != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestAssemblerExpire(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{MaxAge: time.Second}), &recorder{}
	sec := uint64(time.Second)
	a.Add(reqEv(1, 0, "/old", 1*sec), r)
	a.Add(reqEv(1, 1, "/new", 3*sec), r)
	a.Expire(3*sec, r)
	if len(r.done) != 1 || r.done[0].Path != "/old" || r.done[0].Err != ErrEvicted {
		t.Fatalf("expire: %d done", len(r.done))
	}
	// The evicted request's response pairs with nothing.
	a.Add(respEv(1, 0, 200, 3*sec+5, 0), r)
	a.Add(respEv(1, 1, 201, 3*sec+6, 0), r)
	if len(r.done) != 2 || r.done[1].Path != "/new" || r.done[1].Status != 201 {
		t.Fatalf("after expire, /new paired wrongly")
	}
	// A connection left with nothing is forgotten.
	a.Add(reqEv(2, 0, "/gone", 4*sec), r)
	a.Expire(10*sec, r)
	if s := a.Stats(); s.OpenConns != 0 || s.Evicted != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestAssemblerDrain(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/a", 10), r)
	a.Add(reqEv(2, 0, "/b", 10), r)
	a.Drain(50, ErrShutdown, r)
	if len(r.done) != 2 || r.done[0].Err != ErrShutdown || r.done[0].RespEnd != 50 {
		t.Fatalf("drain: %+v", r.done)
	}
}

func TestClock(t *testing.T) {
	c, err := NewClock()
	if err != nil {
		t.Fatal(err)
	}
	// Bracketed by two wall-clock reads, so a preemption anywhere here
	// widens the bracket instead of failing; 1ms allows for the clocks' own
	// steps.
	before := time.Now()
	now := c.Wall(c.NowMono())
	after := time.Now()
	if now.Before(before.Add(-time.Millisecond)) || now.After(after.Add(time.Millisecond)) {
		t.Errorf("Wall(NowMono()) is %v, outside [%v, %v]", now, before, after)
	}
	f := NewClockWithOffset(time.Duration(1e9))
	if got := f.Wall(5); got.UnixNano() != 1e9+5 {
		t.Errorf("fixed clock: %d", got.UnixNano())
	}
}

func TestAssemblerCarriesReward(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/verify", 10), r)
	a.Add(reqEv(1, 1, "/verify", 20), r)
	resp := respEv(1, 0, 200, 30, loader.FlagReward)
	copy(resp.Reward[:], "0.75")
	a.Add(resp, r)
	a.Add(respEv(1, 1, 200, 40, 0), r)
	if len(r.done) != 2 {
		t.Fatalf("done %d, want 2", len(r.done))
	}
	if x := r.done[0]; !x.HasReward || x.Reward != 0.75 {
		t.Errorf("first exchange: reward %v (%v), want 0.75", x.Reward, x.HasReward)
	}
	if x := r.done[1]; x.HasReward || x.Reward != 0 {
		t.Errorf("second exchange: reward %v (%v), want none", x.Reward, x.HasReward)
	}
}

// A response record lost in the ring buffer (issue: a lost record shifted
// every later pairing on its connection by one). Its exchange ends as
// ErrResponseLost, with its request's end for its response's (not known);
// the later ones pair with their own responses.
func TestAssemblerLostResponseShiftsNothing(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/seed_session", 10), r)
	// response 0 lost
	a.Add(reqEv(1, 1, "/get_weather", 30), r)
	a.Add(respEv(1, 1, 201, 40, 0), r)
	a.Add(reqEv(1, 2, "/verify", 50), r)
	a.Add(respEv(1, 2, 202, 60, 0), r)
	if len(r.done) != 3 {
		t.Fatalf("done %d, want 3", len(r.done))
	}
	if x := r.done[0]; x.Path != "/seed_session" || x.Err != ErrResponseLost || x.Status != 0 || x.RespEnd != 11 {
		t.Errorf("lost response: %s err=%v status=%d end=%d, want /seed_session ErrResponseLost 0 11", x.Path, x.Err, x.Status, x.RespEnd)
	}
	if x := r.done[1]; x.Path != "/get_weather" || x.Status != 201 || x.Err != nil {
		t.Errorf("after the loss: %s %d %v, want /get_weather 201", x.Path, x.Status, x.Err)
	}
	if x := r.done[2]; x.Path != "/verify" || x.Status != 202 || x.Err != nil {
		t.Errorf("after the loss: %s %d %v, want /verify 202", x.Path, x.Status, x.Err)
	}
	if s := a.Stats(); s.ResponsesLost != 1 || s.OpenExchanges != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A request record lost: its response pairs with nothing, and the next
// request still gets its own answer.
func TestAssemblerLostRequestShiftsNothing(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	// request 0 lost
	a.Add(respEv(1, 0, 200, 20, 0), r)
	a.Add(reqEv(1, 1, "/b", 30), r)
	a.Add(respEv(1, 1, 201, 40, 0), r)
	if len(r.done) != 1 || r.done[0].Path != "/b" || r.done[0].Status != 201 {
		t.Fatalf("done %d (%v), want /b 201", len(r.done), r.done)
	}
	// Lost while an earlier one waits.
	a.Add(reqEv(2, 0, "/x", 10), r)
	a.Add(reqEv(2, 2, "/z", 30), r) // request 1 lost
	a.Add(respEv(2, 0, 200, 40, 0), r)
	a.Add(respEv(2, 1, 500, 50, 0), r) // answers the lost /y
	a.Add(respEv(2, 2, 202, 60, 0), r)
	got := map[string]int{}
	for _, x := range r.done[1:] {
		got[x.Path] = x.Status
	}
	if got["/x"] != 200 || got["/z"] != 202 || len(got) != 2 {
		t.Errorf("pairs = %v, want /x 200, /z 202", got)
	}
	if s := a.Stats(); s.OrphanResponses != 2 || s.ResponsesLost != 0 {
		t.Errorf("stats %+v", s)
	}
}

// The response record of the last request before a close was lost: the close
// record's count of ended responses says the server answered, so the request
// is not ended as cut off by the close (ErrClosed, an error of the server)
// but as ErrResponseLost. A request the close really cut off stays ErrClosed.
func TestAssemblerCloseAfterLostResponse(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/run", 10), r)
	a.Add(respEv(1, 0, 200, 20, 0), r)
	a.Add(reqEv(1, 1, "/run", 30), r)
	// response 1 lost; request 2 lost
	a.Add(reqEv(1, 3, "/run", 70), r) // cut off by the close
	a.Add(&loader.HTTPEvent{Kind: loader.EvClose, ConnId: 1, Seq: 4, BodyLen: 3, StartNs: 90, EndNs: 90}, r)
	if len(r.done) != 3 {
		t.Fatalf("done %d, want 3", len(r.done))
	}
	if x := r.done[1]; x.Seq != 1 || x.Err != ErrResponseLost || x.RespEnd != 31 {
		t.Errorf("answered, record lost: seq %d err=%v end=%d, want 1 ErrResponseLost 31", x.Seq, x.Err, x.RespEnd)
	}
	if x := r.done[2]; x.Seq != 3 || x.Err != ErrClosed || x.RespEnd != 90 {
		t.Errorf("cut off by the close: seq %d err=%v end=%d, want 3 ErrClosed 90", x.Seq, x.Err, x.RespEnd)
	}
	if s := a.Stats(); s.ResponsesLost != 1 || s.OpenExchanges != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A server request whose record follows a lost one on its connection ends
// the exchanges still waiting there: their responses went out before this
// request came (a client that waits for each answer), only their records
// were lost. Left open, they would look in flight while this request's
// handler runs, and a call bound to one of them would hang under a request
// that is over.
func TestAssemblerLostResponseEndsAtNextRequest(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/v1/responses", 10), r)
	// response 0 lost: the next request's record says so
	next := reqEv(1, 1, "/v1/responses", 30)
	next.Gap = loader.GapLost
	a.Add(next, r)
	if len(r.done) != 1 || r.done[0].Seq != 0 || r.done[0].Err != ErrResponseLost {
		t.Fatalf("done %v, want request 0 ended as ErrResponseLost when request 1 came", r.done)
	}
	a.Add(respEv(1, 1, 200, 40, 0), r)
	if len(r.done) != 2 || r.done[1].Seq != 1 || r.done[1].Status != 200 {
		t.Fatalf("done %v, want request 1 answered 200", r.done)
	}
	// Without a loss nothing is ended early: a pipelining client's first
	// request keeps waiting for its own answer.
	a.Add(reqEv(2, 0, "/a", 50), r)
	a.Add(reqEv(2, 1, "/b", 51), r)
	a.Add(respEv(2, 0, 201, 60, 0), r)
	if x := r.done[len(r.done)-1]; x.Path != "/a" || x.Status != 201 {
		t.Errorf("pipelined: %s %d, want /a 201", x.Path, x.Status)
	}
	if s := a.Stats(); s.ResponsesLost != 1 {
		t.Errorf("stats %+v, want 1 response lost", s)
	}
}

// A request record written late, at its response (loader.GapLate: the ring
// buffer had no room when the request ended), pairs with its response as
// any other, keeps its own times, and says it came late and that a record
// of its connection was lost (what it caused before it came is unparented).
// A late record behind a later request of its connection (pipelined: the
// next one's record came first) is a repeat of nothing and is dropped;
// its response pairs with nothing and shifts nothing.
func TestAssemblerLateRequest(t *testing.T) {
	a, r := NewAssembler(AssemblerOptions{}), &recorder{}
	a.Add(reqEv(1, 0, "/a", 10), r)
	a.Add(respEv(1, 0, 200, 20, 0), r)
	late := reqEv(1, 1, "/b", 30) // ended at 31, written at 50
	late.Gap = loader.GapLate
	a.Add(late, r)
	a.Add(respEv(1, 1, 201, 50, 0), r)
	if len(r.done) != 2 {
		t.Fatalf("done %d, want 2", len(r.done))
	}
	x := r.done[1]
	if x.Path != "/b" || x.Status != 201 || x.ReqStart != 30 || x.ReqEnd != 31 || x.RespStart != 50 {
		t.Errorf("late exchange %s %d req %d-%d resp %d, want /b 201 req 30-31 resp 50", x.Path, x.Status, x.ReqStart, x.ReqEnd, x.RespStart)
	}
	if !x.Late || !x.Lost || x.Gap {
		t.Errorf("late exchange: Late %v Lost %v Gap %v, want late and lost, framing kept", x.Late, x.Lost, x.Gap)
	}
	if r.done[0].Late {
		t.Errorf("the exchange before it says it was late")
	}

	a.Add(reqEv(2, 0, "/x", 10), r)
	a.Add(reqEv(2, 2, "/z", 40), r) // request 1's record lost, then 2's came
	lateY := reqEv(2, 1, "/y", 20)
	lateY.Gap = loader.GapLate
	a.Add(lateY, r)
	a.Add(respEv(2, 0, 200, 45, 0), r)
	a.Add(respEv(2, 1, 500, 50, 0), r)
	a.Add(respEv(2, 2, 202, 60, 0), r)
	got := map[string]int{}
	for _, x := range r.done[2:] {
		got[x.Path] = x.Status
	}
	if got["/x"] != 200 || got["/z"] != 202 || len(got) != 2 {
		t.Errorf("pairs = %v, want /x 200, /z 202", got)
	}
	if s := a.Stats(); s.OutOfOrder != 1 || s.OrphanResponses != 1 {
		t.Errorf("out of order %d, orphan responses %d; want 1 and 1", s.OutOfOrder, s.OrphanResponses)
	}
}
