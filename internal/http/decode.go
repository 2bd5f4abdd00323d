//go:build linux

package http

import (
	"bytes"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"unsafe"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// Sizes of the record's bounded fields (GT_PATH_MAX etc. in contract.h), taken
// from the generated type so they cannot drift from the C side.
var (
	pathMax      = len(loader.HTTPEvent{}.Path)
	hostMax      = len(loader.HTTPEvent{}.Host)
	rolloutIDMax = len(loader.HTTPEvent{}.Rollout.Id)
)

// traceparentLen is the length of a version-00 traceparent value.
const traceparentLen = 55

// DecodeError says why a ring-buffer record was rejected.
type DecodeError struct {
	Reason string
}

func (e *DecodeError) Error() string {
	return "decoding http_event record: " + e.Reason + " (is gymtrace's BPF object from the same build as the binary?)"
}

func decodeErr(format string, args ...any) error {
	return &DecodeError{Reason: fmt.Sprintf(format, args...)}
}

// Decode copies one ring-buffer record into a new loader.HTTPEvent after
// checking its length and bounded fields. The record's bytes are not retained.
func Decode(raw []byte) (*loader.HTTPEvent, error) {
	ev := new(loader.HTTPEvent)
	if err := DecodeInto(ev, raw); err != nil {
		return nil, err
	}
	return ev, nil
}

// DecodeInto is Decode into a caller-owned event, so a reader loop can reuse
// one. The copy is a single memmove of the fixed-size record: the ring buffer's
// sample memory is reused by the reader, and a copy avoids any alignment
// assumption about it.
func DecodeInto(ev *loader.HTTPEvent, raw []byte) error {
	dst := unsafe.Slice((*byte)(unsafe.Pointer(ev)), loader.HTTPEventSize)
	switch {
	case len(raw) >= loader.HTTPEventSize:
		copy(dst, raw[:loader.HTTPEventSize])
	case len(raw) >= loader.HTTPEventHeadSize && raw[0] != loader.EvRequest:
		// Responses and closes carry only the fixed head
		// (GT_HTTP_EVENT_HEAD), and a response with a reward the reward
		// after it (GT_HTTP_EVENT_REWARD): the request fields read as empty.
		n := copy(dst, raw)
		clear(dst[n:])
		ev.PathLen, ev.HostLen = 0, 0
		ev.Flags &^= loader.FlagHost | loader.FlagTraceparent | loader.FlagRollout
		if n < loader.HTTPEventRewardSize {
			ev.Flags &^= loader.FlagReward
		}
	default:
		return decodeErr("record is %d bytes, want at least %d", len(raw), loader.HTTPEventSize)
	}
	return Validate(ev)
}

// Validate checks the fields a reader indexes by: kind, side and the lengths
// of the bounded strings. Everything else is data.
func Validate(ev *loader.HTTPEvent) error {
	switch ev.Kind {
	case loader.EvRequest, loader.EvResponse, loader.EvClose:
	default:
		return decodeErr("unknown event kind %d", ev.Kind)
	}
	if ev.Side > loader.SideClient {
		return decodeErr("unknown connection side %d", ev.Side)
	}
	if int(ev.PathLen) > pathMax {
		return decodeErr("path length %d exceeds %d", ev.PathLen, pathMax)
	}
	if int(ev.HostLen) > hostMax {
		return decodeErr("host length %d exceeds %d", ev.HostLen, hostMax)
	}
	if ev.Flags&loader.FlagRollout != 0 && int(ev.Rollout.IdLen) > rolloutIDMax {
		return decodeErr("rollout id length %d exceeds %d", ev.Rollout.IdLen, rolloutIDMax)
	}
	return nil
}

var methodNames = [...]string{
	loader.MethodUnknown: "_OTHER", // OTel semconv's name for a method it does not know
	loader.MethodGET:     "GET",
	loader.MethodPOST:    "POST",
	loader.MethodPUT:     "PUT",
	loader.MethodDELETE:  "DELETE",
	loader.MethodPATCH:   "PATCH",
	loader.MethodHEAD:    "HEAD",
	loader.MethodOPTIONS: "OPTIONS",
	loader.MethodCONNECT: "CONNECT",
	loader.MethodTRACE:   "TRACE",
}

// MethodName maps a loader.Method* value to its HTTP name, "_OTHER" when unknown.
func MethodName(m uint8) string {
	if int(m) < len(methodNames) {
		return methodNames[m]
	}
	return "_OTHER"
}

// Tuple returns the event's local and remote endpoints. IPv4 comes from the
// kernel as IPv4-mapped IPv6 and is unmapped, so both ends of a connection
// compare equal whichever socket family each side used.
func Tuple(ev *loader.HTTPEvent) (local, remote netip.AddrPort) {
	la := netip.AddrFrom16(ev.Tuple.Laddr).Unmap()
	ra := netip.AddrFrom16(ev.Tuple.Raddr).Unmap()
	return netip.AddrPortFrom(la, ev.Tuple.Lport), netip.AddrPortFrom(ra, ev.Tuple.Rport)
}

// PathOf returns the request path the event carries: "" when it is unknown
// (PathUnknown), and a path longer than the kernel copies cut to its first
// bytes (FlagPathTruncated at full length).
func PathOf(ev *loader.HTTPEvent) string {
	if PathUnknown(ev) {
		return ""
	}
	return string(ev.Path[:min(int(ev.PathLen), pathMax)])
}

// PathUnknown reports a request whose first read ended inside its path (a
// request line written in pieces: FlagPathTruncated on a path shorter than
// the kernel copies). What the kernel saw, "/v" of "/verify", is not the
// path: it would name a span, pick a route and join a client wrongly.
func PathUnknown(ev *loader.HTTPEvent) bool {
	return ev.Flags&loader.FlagPathTruncated != 0 && int(ev.PathLen) < pathMax
}

// HostOf returns the Host header value, "" when the event has none.
func HostOf(ev *loader.HTTPEvent) string {
	if ev.Flags&loader.FlagHost == 0 {
		return ""
	}
	return string(ev.Host[:min(int(ev.HostLen), hostMax)])
}

// TraceparentOf returns the raw traceparent value, "" when the event has none.
// The kernel copies at most 55 bytes and NUL-terminates shorter values.
func TraceparentOf(ev *loader.HTTPEvent) string {
	if ev.Flags&loader.FlagTraceparent == 0 {
		return ""
	}
	tp := ev.Traceparent[:traceparentLen]
	if i := bytes.IndexByte(tp, 0); i >= 0 {
		tp = tp[:i]
	}
	return string(tp)
}

// RolloutOf returns the rollout identity read from a /run body.
func RolloutOf(ev *loader.HTTPEvent) Rollout {
	if ev.Flags&loader.FlagRollout == 0 {
		return Rollout{Task: -1, Index: -1, Attempt: -1}
	}
	r := &ev.Rollout
	return Rollout{
		Present: true,
		Task:    r.Task,
		Index:   r.Rollout,
		Attempt: r.Attempt,
		ID:      string(r.Id[:min(int(r.IdLen), rolloutIDMax)]),
	}
}

// RewardOf returns the reward the kernel read from a /verify response body
// (loader.FlagReward): the text of a JSON number, which the kernel checked
// against JSON's grammar, parsed here. false when the record has none, or
// its text does not parse to a finite float64.
func RewardOf(ev *loader.HTTPEvent) (float64, bool) {
	if ev.Kind != loader.EvResponse || ev.Flags&loader.FlagReward == 0 {
		return 0, false
	}
	txt := ev.Reward[:]
	if i := bytes.IndexByte(txt, 0); i >= 0 {
		txt = txt[:i]
	}
	if !jsonNumber(txt) {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(txt), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false
	}
	return v, true
}

// jsonNumber reports whether b is a JSON number, as the kernel checks it:
// ParseFloat alone would also take "Inf", "0x1p-2" or "1_0".
func jsonNumber(b []byte) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// Encode returns the record bytes of ev, as the kernel would write them: the
// inverse of Decode, for tests and record/replay tools.
func Encode(ev *loader.HTTPEvent) []byte {
	src := unsafe.Slice((*byte)(unsafe.Pointer(ev)), loader.HTTPEventSize)
	return append([]byte(nil), src...)
}
