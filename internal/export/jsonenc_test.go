package export

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/spans"
)

// The hand-written encoder must write exactly what encoding/json writes for
// the documented JSONSpan shape, whatever the strings hold.
func TestAppendSpanJSONMatchesEncodingJSON(t *testing.T) {
	base := time.Unix(1_700_000_000, 5)
	odd := []string{"", "plain", `quo"te`, `back\slash`, "ctl\x00\x01\x1f\t\n", "<html>&amp;", "ünïcødé ✓",
		"bad\xff\xfeutf8", "\u2028\u2029", "emoji 🎯"}
	var in []spans.Span
	in = append(in, testSpans(base)...)
	for i, s := range odd {
		sp := spans.Span{
			Name: "POST /" + s, Kind: trace.SpanKind(i % 6),
			TraceID: trace.TraceID{byte(i), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
			SpanID:  trace.SpanID{byte(i + 1), 2, 3, 4, 5, 6, 7, 8},
			Start:   base.Add(time.Duration(i) * time.Millisecond), End: base.Add(time.Second),
			Attrs: []attribute.KeyValue{
				attribute.String("z.last", s), attribute.String(s+"key", "v"), attribute.Int("http.response.status_code", 200+i),
				attribute.Bool("b", i%2 == 0), attribute.Float64("f", float64(i)/3), attribute.StringSlice("sl", []string{s, "<x>"}),
				attribute.Int64Slice("il", []int64{1, int64(i)}), attribute.String("z.last", "dup wins "+s),
				attribute.String("url.full", "http://h/p?token="+s), attribute.String("Authorization", "Bearer x"),
			},
			Status: codes.Code(i % 3), StatusMsg: s,
		}
		if i%2 == 1 {
			sp.Parent = trace.SpanID{9, byte(i), 9, 9, 9, 9, 9, 9}
		}
		if i == 3 {
			sp.Start = time.Unix(0, 0).Add(-time.Hour) // before the epoch: 0
		}
		if i%3 == 0 {
			sp.Links = []trace.Link{
				{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: sp.TraceID, SpanID: sp.SpanID})},
				{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: sp.TraceID, SpanID: sp.SpanID}),
					Attributes: []attribute.KeyValue{attribute.String("k", s), attribute.String("Cookie", "c")}},
			}
		}
		in = append(in, sp)
	}
	res := NewResources("node-a")
	fast := NewJSONL(&bytes.Buffer{}, res)
	for i := range in {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(oracleJSON(&in[i], res)); err != nil {
			t.Fatal(err)
		}
		got := fast.appendSpanJSON(nil, &in[i])
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("span %d (%q):\n got  %s\n want %s", i, in[i].Name, got, want.Bytes())
		}
	}
}

func BenchmarkJSONLSpan(b *testing.B) {
	in := testSpans(time.Unix(1_700_000_000, 5))
	e := NewJSONL(&bytes.Buffer{}, NewResources("node-a"))
	b.Run("append", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.line = e.appendSpanJSON(e.line[:0], &in[i%len(in)])
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		for i := 0; i < b.N; i++ {
			buf.Reset()
			enc.Encode(oracleJSON(&in[i%len(in)], e.res))
		}
	})
}

func TestSecretKeyFolding(t *testing.T) {
	for k, want := range map[string]bool{
		"http.request.header.authorization": true, "AUTHORIZATION": true, "Proxy-Authorization": true,
		"http.response.header.set-cookie": true, "CoOkIe": true, "coo\u212Aie": true, // Kelvin sign lowers to k
		"url.full": false, "author": false, "cookies_jar": true, "": false, "cooki": false,
	} {
		if got := secretKey(attribute.Key(k)); got != want {
			t.Errorf("secretKey(%q) = %v, want %v", k, got, want)
		}
	}
}

// oracleJSON is the jsonl line as encoding/json writes the documented
// JSONSpan shape: the reference appendSpanJSON is held to.
func oracleJSON(s *spans.Span, res *Resources) JSONSpan {
	js := JSONSpan{
		Name:              s.Name,
		Kind:              KindName(s.Kind),
		TraceID:           s.TraceID.String(),
		SpanID:            s.SpanID.String(),
		StartTimeUnixNano: unixNano(s.Start.UnixNano()),
		EndTimeUnixNano:   unixNano(s.End.UnixNano()),
		Attributes:        attrMap(Sanitize(s.Attrs)),
		Resource:          attrMap(res.For(s.Proc).Attributes()),
		Status:            JSONStatus{Code: StatusName(s.Status)},
	}
	if s.Parent.IsValid() {
		js.ParentSpanID = s.Parent.String()
	}
	if js.Status.Code == "ERROR" {
		js.Status.Message = s.StatusMsg
	}
	for _, l := range s.Links {
		var attrs map[string]any
		if a := Sanitize(l.Attributes); len(a) > 0 {
			attrs = attrMap(a)
		}
		js.Links = append(js.Links, JSONLink{
			TraceID:    l.SpanContext.TraceID().String(),
			SpanID:     l.SpanContext.SpanID().String(),
			Attributes: attrs,
		})
	}
	return js
}

func attrMap(attrs []attribute.KeyValue) map[string]any {
	m := make(map[string]any, len(attrs))
	for _, kv := range attrs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}
