//go:build linux

// Package http turns the kernel's per-message records (loader.HTTPEvent) into
// HTTP exchanges: it decodes ring-buffer bytes, pairs each request with its
// response per connection by the kernel's request index (so pipelining pairs
// correctly, and a lost record shifts nothing), and converts
// kernel monotonic timestamps to wall-clock time. It knows nothing of Gym:
// naming, groups and parents are internal/spans' job.
package http

import (
	"errors"
	"net/netip"
	"strconv"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// Why an exchange ended without a complete response. Exchange.Err holds one of
// these (possibly wrapped); nil means the response completed normally.
var (
	// ErrConnReset: the connection failed (reset, read/write error) before
	// the response was complete.
	ErrConnReset = errors.New("connection reset or failed before the response completed")
	// ErrClosed: the connection closed cleanly with this request unanswered.
	ErrClosed = errors.New("connection closed before the response")
	// ErrEvicted: gymtrace gave up waiting for the response (state limits or
	// age); the exchange may still be running in the traced process.
	ErrEvicted = errors.New("exchange evicted by gymtrace before its response was seen")
	// ErrShutdown: gymtrace stopped while the exchange was in flight.
	ErrShutdown = errors.New("gymtrace stopped before the response was seen")
	// ErrResponseLost: a later response on the connection arrived first, so
	// this one's record was lost (ring buffer full, or the kernel lost the
	// connection's framing). The exchange ended; when is not known, so its
	// response times are its request's end.
	ErrResponseLost = errors.New("the response's record was lost")
)

// Rollout is the rollout identity the kernel read from a /run request body
// (only these keys are ever scanned for). Fields are -1 when absent.
type Rollout struct {
	Present bool // the kernel found at least one key
	Task    int32
	Index   int32
	Attempt int32
	ID      string // _ng_rollout_id, "" when absent
}

// GymID is the rollout id as Gym builds it: _ng_rollout_id when the row
// carries one, else "{task}-{rollout}", with "-a{attempt}" when an attempt
// index is present. "" when the body gave nothing usable.
func (r Rollout) GymID() string {
	if !r.Present {
		return ""
	}
	if r.ID != "" {
		return r.ID
	}
	if r.Task < 0 || r.Index < 0 {
		return ""
	}
	b := make([]byte, 0, 24)
	b = strconv.AppendInt(b, int64(r.Task), 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(r.Index), 10)
	if r.Attempt >= 0 {
		b = append(b, "-a"...)
		b = strconv.AppendInt(b, int64(r.Attempt), 10)
	}
	return string(b)
}

// Exchange is one HTTP request and, once complete, its response, as seen by
// one traced process on one connection. The Assembler hands the same pointer
// to Handler.RequestStarted (response fields still zero) and to
// Handler.ExchangeDone.
type Exchange struct {
	ConnID uint64
	PID    uint32 // tgid of the traced process
	TID    uint32 // thread that moved the request's last byte
	Side   uint8  // loader.SideServer or loader.SideClient
	Role   uint8  // loader.Role* the kernel knew when the request was seen
	Seq    uint64 // the request's index on its connection (kernel count)

	Local, Remote netip.AddrPort // IPv4 addresses are unmapped (1.2.3.4, not ::ffff:1.2.3.4)

	Method      string // "GET", "POST", ...; "_OTHER" when the kernel did not know it
	Path        string // request path, never a query string; "" when PathUnknown
	PathUnknown bool   // the kernel saw only part of the path (PathUnknown): no name, route or join by it
	Host        string // Host header value, "" when absent
	Traceparent string // raw traceparent header value, "" when absent (not validated here)
	// Server requests without traceparent in a process whose calls gymtrace
	// injects: the trace the kernel started and published for the
	// handler's calls (loader.FlagKernelTrace), and its sampled bit.
	KernelTrace   [16]byte
	KernelSampled bool
	Rollout       Rollout

	Status int // response status code, 0 when no response was seen

	// Reward is the top-level "reward" number of a /verify response body,
	// read by the kernel (server side, the verify group on, with --reward;
	// bpf/http_reward.h gt_scan_reward); HasReward says whether there was one.
	// Nothing else of any body reaches userspace.
	Reward    float64
	HasReward bool

	// GenAI holds the model names and token counts the kernel read from a
	// model exchange's bodies (server side, model_call or rollout on, with
	// --genai; bpf/http_genai.h); nil when it read none.
	GenAI *GenAI

	// CLOCK_MONOTONIC nanoseconds: first and last byte of the request and of
	// the response crossing a syscall. RespStart/RespEnd are the moment of the
	// close or eviction when there was no response.
	ReqStart, ReqEnd, RespStart, RespEnd uint64

	ReqFlags, RespFlags uint16 // loader.Flag*
	Groups              uint64 // group bits the kernel let through for this exchange
	ReqBodyLen          uint64
	RespBodyLen         uint64

	// asyncio Context identities the kernel read at the request's and the
	// response's first syscalls (0 when unknown): the context and the
	// request-handler root it works for (bpf/python.h).
	PyCtx, PyRoot         uint64
	RespPyCtx, RespPyRoot uint64
	// CauseConn/CauseSeq name, for a client request, the inbound request
	// (server ConnID and Seq) whose handler made the call, as the kernel bound
	// it through the asyncio context; 0 when unknown.
	CauseConn, CauseSeq uint64
	// StreamSeq is the TCP sequence number of the request's first byte in
	// its direction's stream, as this end's kernel read it; HasStreamSeq
	// says whether it did (not for TLS plaintext). The client and the
	// server of one connection on this node read the same number for the
	// same request: their records pair exactly (spans, join.go).
	StreamSeq    uint32
	HasStreamSeq bool
	// Gap: the kernel lost this side's framing on the connection at some
	// point before this request, so Seq may not match the peer's count.
	// Lost: a record of this connection was lost just before this one.
	// Late: this request's record came late, at its handler's first call
	// or its response (the ring buffer had no room when the request ended;
	// loader.GapLate): records of calls made before that came first. Lost
	// is set too.
	Gap, Lost, Late bool

	// Err is nil when the response completed, else why it did not (ErrConnReset,
	// ErrClosed, ErrEvicted, ErrShutdown). A response that arrived but whose
	// connection failed mid-body has Status set and Err == ErrConnReset.
	Err error

	// Handle belongs to the Handler: whatever it stores at RequestStarted it
	// finds again at ExchangeDone, without a map lookup.
	Handle any
}

// Flags is the union of the request's and the response's flags.
func (x *Exchange) Flags() uint16 { return x.ReqFlags | x.RespFlags }

// IsServer reports whether the traced process answered this request.
func (x *Exchange) IsServer() bool { return x.Side == loader.SideServer }
