package export

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// appendSpanJSON appends s as one jsonl line, byte for byte what
// encoding/json writes for the JSONSpan of s with HTML escaping off (a test
// holds the two together), without reflection or a map per span: the agent
// encodes every span it exports, so this is on its hot path. The resource,
// the same for every span of a process, is encoded once and cached.
func (e *JSONLExporter) appendSpanJSON(b []byte, s *spans.Span) []byte {
	b = append(b, `{"name":`...)
	b = appendJSONString(b, s.Name)
	b = append(b, `,"kind":"`...)
	b = append(b, KindName(s.Kind)...)
	b = append(b, `","trace_id":"`...)
	b = hex.AppendEncode(b, s.TraceID[:])
	b = append(b, `","span_id":"`...)
	b = hex.AppendEncode(b, s.SpanID[:])
	b = append(b, `","parent_span_id":"`...)
	if s.Parent.IsValid() {
		b = hex.AppendEncode(b, s.Parent[:])
	}
	b = append(b, `","start_time_unix_nano":`...)
	b = strconv.AppendUint(b, unixNano(s.Start.UnixNano()), 10)
	b = append(b, `,"end_time_unix_nano":`...)
	b = strconv.AppendUint(b, unixNano(s.End.UnixNano()), 10)
	b = append(b, `,"attributes":`...)
	b = e.appendAttrs(b, Sanitize(s.Attrs))
	b = append(b, `,"resource":`...)
	b = append(b, e.resourceJSON(s)...)
	code := StatusName(s.Status)
	b = append(b, `,"status":{"code":"`...)
	b = append(b, code...)
	b = append(b, '"')
	if code == "ERROR" && s.StatusMsg != "" {
		b = append(b, `,"message":`...)
		b = appendJSONString(b, s.StatusMsg)
	}
	b = append(b, '}')
	if len(s.Links) > 0 {
		b = append(b, `,"links":[`...)
		for i, l := range s.Links {
			if i > 0 {
				b = append(b, ',')
			}
			tid, sid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
			b = append(b, `{"trace_id":"`...)
			b = hex.AppendEncode(b, tid[:])
			b = append(b, `","span_id":"`...)
			b = hex.AppendEncode(b, sid[:])
			b = append(b, '"')
			if attrs := Sanitize(l.Attributes); len(attrs) > 0 {
				b = append(b, `,"attributes":`...)
				b = e.appendAttrs(b, attrs)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}', '\n')
}

// resourceJSON is the process's resource as encoding/json writes its map.
func (e *JSONLExporter) resourceJSON(s *spans.Span) []byte {
	r := e.res.For(s.Proc)
	if j, ok := e.resJSON[r]; ok {
		return j
	}
	if len(e.resJSON) >= maxCachedResources {
		clear(e.resJSON)
	}
	j := e.appendAttrs(nil, r.Attributes())
	if e.resJSON == nil {
		e.resJSON = make(map[*resource.Resource][]byte)
	}
	e.resJSON[r] = j
	return j
}

// appendAttrs writes attrs as a JSON object the way encoding/json writes
// a map of them: keys sorted, the last of duplicate keys kept.
func (e *JSONLExporter) appendAttrs(b []byte, attrs []attribute.KeyValue) []byte {
	idx := e.attrIdx[:0]
	for i := range attrs {
		idx = append(idx, i)
	}
	// Stable: among equal keys the last one given sorts last, and is kept.
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(attrs[x].Key, attrs[y].Key) })
	keep := idx[:0]
	for n, i := range idx {
		if n+1 < len(idx) && attrs[idx[n+1]].Key == attrs[i].Key {
			continue
		}
		keep = append(keep, i)
	}
	idx = keep
	e.attrIdx = idx
	b = append(b, '{')
	for n, i := range idx {
		if n > 0 {
			b = append(b, ',')
		}
		kv := attrs[i]
		b = appendJSONString(b, string(kv.Key))
		b = append(b, ':')
		switch kv.Value.Type() {
		case attribute.STRING:
			b = appendJSONString(b, kv.Value.AsString())
		case attribute.INT64:
			b = strconv.AppendInt(b, kv.Value.AsInt64(), 10)
		case attribute.BOOL:
			b = strconv.AppendBool(b, kv.Value.AsBool())
		default:
			// Floats and slices: rare, and encoding/json's formatting
			// is the reference.
			j, err := marshalNoHTML(kv.Value.AsInterface())
			if err != nil {
				j = []byte("null")
			}
			b = append(b, j...)
		}
	}
	return append(b, '}')
}

// appendJSONString quotes s as encoding/json does with HTML escaping off.
func appendJSONString(b []byte, s string) []byte {
	clean := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			clean = false
			break
		}
	}
	if clean {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	var buf json.RawMessage
	buf, _ = marshalNoHTML(s)
	return append(b, buf...)
}
