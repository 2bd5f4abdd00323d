package export

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// ProtoSpans turns a batch into OTLP messages: one ResourceSpans per process
// Resource, in order of first appearance, each with one ScopeSpans (scope
// ScopeName) holding that process's spans in batch order. Attributes are
// sanitized (Sanitize). The messages are the ones the SDK's own transform
// makes from the same spans as read-only spans (a test compares the two
// field by field); the cost was in getting there: a snapshot per span, a map
// lookup per span, and four allocations per attribute. Here the messages
// are carved out of a few slices per batch.
func ProtoSpans(batch []spans.Span, res *Resources) []*tracepb.ResourceSpans {
	if len(batch) == 0 {
		return nil
	}
	// Resources in order of first appearance, and each span's index.
	var rsrc []*resource.Resource
	which := make([]int32, len(batch))
	count := make([]int, 0, 4)
	attrs := make([][]attribute.KeyValue, len(batch))
	nAttrs := 0
	for i := range batch {
		r := res.For(batch[i].Proc)
		j := 0
		for j < len(rsrc) && rsrc[j] != r {
			j++
		}
		if j == len(rsrc) {
			rsrc = append(rsrc, r)
			count = append(count, 0)
		}
		which[i] = int32(j)
		count[j]++
		attrs[i] = Sanitize(batch[i].Attrs)
		nAttrs += len(attrs[i])
	}

	scope := &commonpb.InstrumentationScope{Name: ScopeName}
	out := make([]*tracepb.ResourceSpans, len(rsrc))
	// One backing array for every resource's span pointers, cut by counts.
	ptrs := make([]*tracepb.Span, len(batch))
	for j, off := 0, 0; j < len(rsrc); j++ {
		from := off
		off += count[j]
		out[j] = &tracepb.ResourceSpans{
			Resource: &resourcepb.Resource{Attributes: anyKeyValues(rsrc[j].Attributes())},
			ScopeSpans: []*tracepb.ScopeSpans{{
				Scope: scope,
				Spans: ptrs[from:from:off],
			}},
			SchemaUrl: rsrc[j].SchemaURL(),
		}
	}

	pb := make([]tracepb.Span, len(batch))
	st := make([]tracepb.Status, len(batch))
	kv := newKVSlab(nAttrs)
	for i := range batch {
		s := &batch[i]
		p := &pb[i]
		p.TraceId = s.TraceID[:]
		p.SpanId = s.SpanID[:]
		if s.Parent.IsValid() {
			p.ParentSpanId = s.Parent[:]
		}
		p.Name = s.Name
		p.Kind = spanKind(s.Kind)
		p.StartTimeUnixNano = unixNano(s.Start.UnixNano())
		p.EndTimeUnixNano = unixNano(s.End.UnixNano())
		p.Attributes = kv.values(attrs[i])
		// Exported means sampled; the parent is not marked remote (the SDK
		// path this replaces did not know it either).
		p.Flags = uint32(trace.FlagsSampled) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
		switch s.Status {
		case codes.Error:
			st[i].Code = tracepb.Status_STATUS_CODE_ERROR
			st[i].Message = s.StatusMsg // only an error carries a description
		case codes.Ok:
			st[i].Code = tracepb.Status_STATUS_CODE_OK
		}
		p.Status = &st[i]
		for _, l := range s.Links {
			tid, sid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
			flags := uint32(l.SpanContext.TraceFlags()) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
			if l.SpanContext.IsRemote() {
				flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
			}
			p.Links = append(p.Links, &tracepb.Span_Link{
				TraceId:    tid[:],
				SpanId:     sid[:],
				Attributes: anyKeyValues(Sanitize(l.Attributes)),
				Flags:      flags,
			})
		}
		j := which[i]
		sp := &out[j].ScopeSpans[0].Spans
		*sp = append(*sp, p)
	}
	return out
}

func spanKind(k trace.SpanKind) tracepb.Span_SpanKind {
	switch k {
	case trace.SpanKindInternal:
		return tracepb.Span_SPAN_KIND_INTERNAL
	case trace.SpanKindServer:
		return tracepb.Span_SPAN_KIND_SERVER
	case trace.SpanKindClient:
		return tracepb.Span_SPAN_KIND_CLIENT
	case trace.SpanKindProducer:
		return tracepb.Span_SPAN_KIND_PRODUCER
	case trace.SpanKindConsumer:
		return tracepb.Span_SPAN_KIND_CONSUMER
	}
	return tracepb.Span_SPAN_KIND_UNSPECIFIED
}

// kvSlab hands out the attribute messages of one batch from shared arrays:
// the key-value, its AnyValue and the oneof wrapper of the common scalar
// kinds. Other kinds (slices, maps) are allocated one by one.
type kvSlab struct {
	ptrs []*commonpb.KeyValue
	kvs  []commonpb.KeyValue
	avs  []commonpb.AnyValue
	strs []commonpb.AnyValue_StringValue
	ints []commonpb.AnyValue_IntValue
}

func newKVSlab(n int) *kvSlab {
	return &kvSlab{
		ptrs: make([]*commonpb.KeyValue, 0, n),
		kvs:  make([]commonpb.KeyValue, n),
		avs:  make([]commonpb.AnyValue, n),
		strs: make([]commonpb.AnyValue_StringValue, 0, n),
		ints: make([]commonpb.AnyValue_IntValue, 0, n),
	}
}

func (k *kvSlab) values(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	first := len(k.ptrs)
	for _, a := range attrs {
		n := len(k.ptrs)
		kv, av := &k.kvs[n], &k.avs[n]
		kv.Key = string(a.Key)
		kv.Value = av
		switch a.Value.Type() {
		case attribute.STRING:
			k.strs = append(k.strs, commonpb.AnyValue_StringValue{StringValue: a.Value.AsString()})
			av.Value = &k.strs[len(k.strs)-1]
		case attribute.INT64:
			k.ints = append(k.ints, commonpb.AnyValue_IntValue{IntValue: a.Value.AsInt64()})
			av.Value = &k.ints[len(k.ints)-1]
		default:
			av.Value = anyValue(a.Value).Value
		}
		k.ptrs = append(k.ptrs, kv)
	}
	return k.ptrs[first:len(k.ptrs):len(k.ptrs)]
}

func anyKeyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, len(attrs))
	for i, a := range attrs {
		out[i] = &commonpb.KeyValue{Key: string(a.Key), Value: anyValue(a.Value)}
	}
	return out
}

// anyValue is the OTLP form of any attribute value, as the SDK's transform
// makes it.
func anyValue(v attribute.Value) *commonpb.AnyValue {
	av := new(commonpb.AnyValue)
	switch v.Type() {
	case attribute.BOOL:
		av.Value = &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}
	case attribute.INT64:
		av.Value = &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}
	case attribute.FLOAT64:
		av.Value = &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}
	case attribute.STRING:
		av.Value = &commonpb.AnyValue_StringValue{StringValue: v.AsString()}
	case attribute.BOOLSLICE:
		av.Value = arrayOf(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		av.Value = arrayOf(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		av.Value = arrayOf(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		av.Value = arrayOf(v.AsStringSlice(), attribute.StringValue)
	case attribute.BYTESLICE:
		av.Value = &commonpb.AnyValue_BytesValue{BytesValue: v.AsByteSlice()}
	case attribute.SLICE:
		out := make([]*commonpb.AnyValue, 0, len(v.AsSlice()))
		for _, x := range v.AsSlice() {
			out = append(out, anyValue(x))
		}
		av.Value = &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: out}}
	case attribute.MAP:
		av.Value = &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{Values: anyKeyValues(v.AsMap())}}
	case attribute.EMPTY:
	default:
		av.Value = &commonpb.AnyValue_StringValue{StringValue: "INVALID"}
	}
	return av
}

func arrayOf[T any](vals []T, mk func(T) attribute.Value) *commonpb.AnyValue_ArrayValue {
	out := make([]*commonpb.AnyValue, len(vals))
	for i, x := range vals {
		out[i] = anyValue(mk(x))
	}
	return &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: out}}
}
