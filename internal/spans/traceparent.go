package spans

import (
	"encoding/hex"

	"go.opentelemetry.io/otel/trace"
)

// ParseTraceparent validates a W3C Trace Context traceparent value and returns
// the remote span context it names. It follows the spec's parsing rules:
// lower-case hex only, version ff invalid, version 00 exactly 55 characters,
// later versions at least 55 with a '-' after the flags, and neither id all
// zeros. ok is false for anything else, which the caller must then ignore.
func ParseTraceparent(s string) (sc trace.SpanContext, ok bool) {
	if len(s) < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return sc, false
	}
	if !lowerHex(s[0:2]) || s[0:2] == "ff" {
		return sc, false
	}
	if s[0:2] == "00" {
		if len(s) != 55 {
			return sc, false
		}
	} else if len(s) > 55 && s[55] != '-' {
		return sc, false
	}
	if !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return sc, false
	}
	var tid trace.TraceID
	var sid trace.SpanID
	var flags [1]byte
	hex.Decode(tid[:], []byte(s[3:35]))
	hex.Decode(sid[:], []byte(s[36:52]))
	hex.Decode(flags[:], []byte(s[53:55]))
	if !tid.IsValid() || !sid.IsValid() {
		return sc, false
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tid,
		SpanID:     sid,
		TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled,
		Remote:     true,
	}), true
}

// FormatTraceparent renders a version-00 traceparent for a span.
func FormatTraceparent(tid trace.TraceID, sid trace.SpanID, sampled bool) string {
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	if sampled {
		return string(append(b, "-01"...))
	}
	return string(append(b, "-00"...))
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
