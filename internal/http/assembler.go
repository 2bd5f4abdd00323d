//go:build linux

package http

import (
	"time"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// Handler receives the Assembler's output. Both calls get the same *Exchange
// for one request; the Handler may keep it until ExchangeDone returns.
type Handler interface {
	// RequestStarted is called when a request's record arrives (its last byte
	// has crossed a syscall), before any later record is processed: the place
	// to decide span ids, so that a server request on this node can join the
	// client request that sent it.
	RequestStarted(x *Exchange)
	// ExchangeDone is called once per started exchange: with its response, or
	// with Err set when the connection closed or the state was evicted.
	ExchangeDone(x *Exchange)
}

// AssemblerOptions bound the Assembler's memory. Zero values take defaults.
type AssemblerOptions struct {
	// MaxConns caps connections with requests in flight (default 65536).
	// Connections without one hold no state at all.
	MaxConns int
	// MaxPending caps requests awaiting a response on one connection
	// (default 64). Pipelining deeper than this loses the newest requests.
	MaxPending int
	// MaxAge evicts a request whose response has not come after this long
	// (default 1h: Gym's HTTP client has no timeout and rollouts are long).
	MaxAge time.Duration
}

// AssemblerStats are the Assembler's counters. Counts are totals since
// creation; OpenConns and OpenExchanges are current values.
type AssemblerStats struct {
	Requests, Responses, Closes uint64 // records consumed, by kind
	Completed                   uint64 // exchanges handed to ExchangeDone
	Failed                      uint64 // ... of which ended by a connection error or close
	OrphanResponses             uint64 // responses with no request to pair (request dropped, or connection picked up mid-exchange)
	UnknownSide                 uint64 // requests on a connection whose side the kernel did not know
	DroppedConnLimit            uint64 // requests dropped because MaxConns connections were busy
	DroppedPendingLimit         uint64 // requests dropped because MaxPending were waiting on their connection
	Evicted                     uint64 // exchanges given up after MaxAge
	ResponsesLost               uint64 // exchanges whose response record never came while a later one did, or the close said it ended (ErrResponseLost)
	OutOfOrder                  uint64 // requests whose index was not above their connection's newest (dropped)
	GenAI                       uint64 // GenAI records consumed (model exchanges' values, AddGenAI)
	GenAIOrphans                uint64 // ... whose request was not waiting for its response (dropped)
	OpenConns                   int
	OpenExchanges               int
}

// A connection's requests awaiting responses, in the kernel's request order
// (Exchange.Seq). A response names the request it answers by that index, so
// a record lost in between (the ring buffer was full) leaves its own
// exchange unpaired and shifts no other.
type conn struct {
	q []*Exchange
}

// Assembler pairs requests and responses per connection. It is not safe for
// concurrent use: one goroutine (the ring-buffer reader) owns it.
type Assembler struct {
	opt       AssemblerOptions
	conns     map[uint64]*conn
	now       uint64 // newest kernel timestamp seen
	lastSweep uint64
	st        AssemblerStats
}

// sweepEvery is how often, in kernel time, Add looks for expired exchanges.
const sweepEvery = uint64(10 * time.Second)

// NewAssembler returns an Assembler with the given limits.
func NewAssembler(opt AssemblerOptions) *Assembler {
	if opt.MaxConns <= 0 {
		opt.MaxConns = 65536
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = 64
	}
	if opt.MaxAge <= 0 {
		opt.MaxAge = time.Hour
	}
	return &Assembler{opt: opt, conns: make(map[uint64]*conn)}
}

// Stats returns the counters.
func (a *Assembler) Stats() AssemblerStats {
	s := a.st
	s.OpenConns = len(a.conns)
	s.OpenExchanges = 0
	for _, c := range a.conns {
		s.OpenExchanges += len(c.q)
	}
	return s
}

// Now is the newest kernel (CLOCK_MONOTONIC) timestamp the Assembler has seen.
func (a *Assembler) Now() uint64 { return a.now }

// Add consumes one record and calls h for what it completes.
func (a *Assembler) Add(ev *loader.HTTPEvent, h Handler) {
	if t := max(ev.EndNs, ev.StartNs); t > a.now {
		a.now = t
	}
	switch ev.Kind {
	case loader.EvRequest:
		a.st.Requests++
		a.request(ev, h)
	case loader.EvResponse:
		a.st.Responses++
		a.response(ev, h)
	case loader.EvClose:
		a.st.Closes++
		if c := a.conns[ev.ConnId]; c != nil {
			err := ErrClosed
			if ev.Flags&loader.FlagConnError != 0 {
				err = ErrConnReset
			}
			a.lostBefore(c, ev.BodyLen, h)
			a.finishAll(ev.ConnId, c, err, closeTime(ev), h)
		}
	}
	if a.now-a.lastSweep >= sweepEvery {
		a.Expire(a.now, h)
	}
}

func closeTime(ev *loader.HTTPEvent) uint64 {
	if ev.EndNs != 0 {
		return ev.EndNs
	}
	return ev.StartNs
}

func (a *Assembler) request(ev *loader.HTTPEvent, h Handler) {
	if ev.Side != loader.SideServer && ev.Side != loader.SideClient {
		a.st.UnknownSide++
		return
	}
	c := a.conns[ev.ConnId]
	if c == nil {
		if len(a.conns) >= a.opt.MaxConns {
			a.Expire(a.now, h)
		}
		if len(a.conns) >= a.opt.MaxConns {
			a.st.DroppedConnLimit++
			return
		}
		c = &conn{}
		a.conns[ev.ConnId] = c
	}
	if n := len(c.q); n > 0 && c.q[n-1].Seq >= ev.Seq {
		// The kernel numbers a connection's requests in order and one
		// process's records of one connection arrive in order: a repeat
		// is a connection id reused, never a request to pair.
		a.st.OutOfOrder++
		return
	}
	if ev.Side == loader.SideServer && ev.Gap&loader.GapLost != 0 {
		// A record of this connection was lost just before this request's.
		// Exchanges still waiting here had their response records lost, or
		// their client pipelines: a client that waits for each answer
		// (aiohttp, every Gym client) sends the next request only after
		// the whole response. Left open, such an exchange would look in
		// flight until the next response or the close, and whatever names
		// it meanwhile (a call bound to a context that outlived it) would
		// hang under a request that is over. Ended as lost here; a
		// pipelined response that comes after all pairs with nothing
		// (OrphanResponses), and no pairing shifts.
		a.lostBefore(c, ev.Seq, h)
	}
	if len(c.q) >= a.opt.MaxPending {
		// Its response, when it comes, finds no request of its index and
		// is dropped: nothing else shifts.
		a.st.DroppedPendingLimit++
		return
	}
	x := &Exchange{
		ConnID:      ev.ConnId,
		PID:         ev.Pid,
		TID:         ev.Tid,
		Side:        ev.Side,
		Role:        ev.Role,
		Seq:         ev.Seq,
		Method:      MethodName(ev.Method),
		Path:        PathOf(ev),
		PathUnknown: PathUnknown(ev),
		Host:        HostOf(ev),
		Traceparent: TraceparentOf(ev),
		Rollout:     RolloutOf(ev),
		ReqStart:    ev.StartNs,
		ReqEnd:      ev.EndNs,
		ReqFlags:    ev.Flags,
		Groups:      ev.Groups,
		ReqBodyLen:  ev.BodyLen,
		PyCtx:       ev.PyCtx,
		PyRoot:      ev.PyRoot,
		CauseConn:   ev.CauseConn,
		CauseSeq:    ev.CauseSeq,
		StreamSeq:   ev.StreamSeq,
	}
	x.HasStreamSeq = ev.StreamOk != 0
	x.Gap, x.Lost = ev.Gap&loader.GapFraming != 0, ev.Gap&loader.GapLost != 0
	// A late record was itself lost for room once: whatever depended on its
	// coming first (the parents of its handler's earlier calls) is missing.
	x.Late = ev.Gap&loader.GapLate != 0
	x.Lost = x.Lost || x.Late
	x.Local, x.Remote = Tuple(ev)
	if ev.Flags&loader.FlagKernelTrace != 0 && ev.Flags&loader.FlagTraceparent == 0 && ev.Side == loader.SideServer {
		copy(x.KernelTrace[:], ev.Traceparent[:16])
		x.KernelSampled = ev.Traceparent[16]&1 != 0
	}
	c.q = append(c.q, x)
	h.RequestStarted(x)
}

func (a *Assembler) response(ev *loader.HTTPEvent, h Handler) {
	c := a.conns[ev.ConnId]
	if c == nil {
		a.st.OrphanResponses++
		return
	}
	// Requests before the one this response answers will get no response
	// record: HTTP/1.x answers in order, so theirs were lost.
	a.lostBefore(c, ev.Seq, h)
	if len(c.q) == 0 || c.q[0].Seq != ev.Seq {
		a.st.OrphanResponses++ // its request's record was lost, or came before attach
	} else {
		x := c.q[0]
		c.q[0] = nil
		c.q = c.q[1:]
		x.Status = int(ev.Status)
		x.RespStart, x.RespEnd = ev.StartNs, ev.EndNs
		x.RespFlags = ev.Flags
		x.RespBodyLen = ev.BodyLen
		x.RespPyCtx, x.RespPyRoot = ev.PyCtx, ev.PyRoot
		x.Reward, x.HasReward = RewardOf(ev)
		if ev.Flags&loader.FlagConnError != 0 {
			x.Err = ErrConnReset
		}
		a.complete(x, h)
	}
	// After an Upgrade or a body ended by close the connection carries no
	// more HTTP: anything still queued will never be answered.
	if ev.Flags&(loader.FlagUpgrade|loader.FlagEndByClose) != 0 {
		a.finishAll(ev.ConnId, c, ErrClosed, ev.EndNs, h)
		return
	}
	if len(c.q) == 0 {
		delete(a.conns, ev.ConnId)
	}
}

// lostBefore ends as ErrResponseLost the queued requests below seq: a later
// response came, or a close record says that many responses ended. Each had
// its response, whose record was lost. When it ended is not known (a
// keep-alive connection's next request can come much later): the span ends
// with its request, marked truncated.
func (a *Assembler) lostBefore(c *conn, seq uint64, h Handler) {
	k := 0
	for k < len(c.q) && c.q[k].Seq < seq {
		x := c.q[k]
		x.Err = ErrResponseLost
		x.RespStart, x.RespEnd = x.ReqEnd, x.ReqEnd
		a.st.ResponsesLost++
		a.complete(x, h)
		c.q[k] = nil
		k++
	}
	c.q = c.q[k:]
}

func (a *Assembler) complete(x *Exchange, h Handler) {
	a.st.Completed++
	if x.Err != nil {
		a.st.Failed++
	}
	h.ExchangeDone(x)
}

// finishAll ends every request queued on a connection with err at time t and
// forgets the connection.
func (a *Assembler) finishAll(id uint64, c *conn, err error, t uint64, h Handler) {
	delete(a.conns, id)
	for _, x := range c.q {
		x.Err = err
		x.RespStart, x.RespEnd = t, t
		if err == ErrEvicted {
			a.st.Evicted++
		}
		a.complete(x, h)
	}
	c.q = nil
}

// Expire ends requests older than MaxAge at kernel time now (ErrEvicted) and
// forgets connections left with none. Add calls it every few seconds of kernel time; call it from a
// timer too when records may stop arriving.
func (a *Assembler) Expire(now uint64, h Handler) {
	a.lastSweep = now
	maxAge := uint64(a.opt.MaxAge)
	if now < maxAge {
		return
	}
	cutoff := now - maxAge
	for id, c := range a.conns {
		kept := c.q[:0]
		for _, x := range c.q {
			if x.ReqStart >= cutoff {
				kept = append(kept, x)
				continue
			}
			x.Err = ErrEvicted
			x.RespStart, x.RespEnd = now, now
			a.st.Evicted++
			a.complete(x, h)
		}
		clear(c.q[len(kept):])
		c.q = kept
		if len(c.q) == 0 {
			delete(a.conns, id)
		}
	}
}

// Drain ends every request still waiting, with err (ErrShutdown at exit) at
// kernel time now, and forgets all state.
func (a *Assembler) Drain(now uint64, err error, h Handler) {
	for id, c := range a.conns {
		a.finishAll(id, c, err, now, h)
	}
}
