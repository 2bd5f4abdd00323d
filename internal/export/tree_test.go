package export

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/spans"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var resProc = &discover.Process{PID: 4545, Role: roleResources, ServerName: "weather_resources", Comm: "python"}

// rolloutBuilder makes spans of one trace with sequential ids and times
// relative to base.
type rolloutBuilder struct {
	trace trace.TraceID
	base  time.Time
	next  uint64
	out   []spans.Span
}

func (b *rolloutBuilder) span(parent trace.SpanID, name string, kind trace.SpanKind, p *discover.Process,
	startMs, endMs float64, attrs ...attribute.KeyValue) trace.SpanID {
	b.next++
	id := sid(fmt.Sprintf("%016x", b.next))
	b.out = append(b.out, spans.Span{
		Name: name, Kind: kind, TraceID: b.trace, SpanID: id, Parent: parent,
		Start: b.base.Add(time.Duration(startMs * float64(time.Millisecond))),
		End:   b.base.Add(time.Duration(endMs * float64(time.Millisecond))),
		Attrs: attrs, Proc: p,
	})
	return id
}

func status(c int) attribute.KeyValue     { return attribute.Int("http.response.status_code", c) }
func urlAttr(u string) attribute.KeyValue { return attribute.String("url.full", u) }

func sampleRollout(base time.Time) []spans.Span {
	b := &rolloutBuilder{trace: tid("4bf92f3577b34da6a3ce929d0e0e4736"), base: base}
	srv, cli, in := trace.SpanKindServer, trace.SpanKindClient, trace.SpanKindInternal
	rid := attribute.String("nemo.gym.rollout.id", "3-0")
	run := b.span(trace.SpanID{}, "POST /run", srv, agentProc, 0, 812, status(200), attribute.String("http.route", "/run"))
	ro := b.span(run, "gym.rollout", in, agentProc, 0.4, 811, rid)
	c1 := b.span(ro, "HTTP POST", cli, agentProc, 1, 21, urlAttr("http://127.0.0.1:8003/seed_session"), status(200))
	b.span(c1, "POST /seed_session", srv, resProc, 2, 20, status(200))
	c2 := b.span(ro, "HTTP POST", cli, agentProc, 22, 700, urlAttr("http://127.0.0.1:8001/v1/responses"), status(200))
	ar := b.span(c2, "POST /v1/responses", srv, agentProc, 23, 699, status(200))
	ag := b.span(ar, "gym.agent.responses", in, agentProc, 23.2, 698, rid)
	c3 := b.span(ag, "HTTP POST", cli, agentProc, 24, 512, urlAttr("http://127.0.0.1:8002/v1/responses"), status(200))
	mr := b.span(c3, "POST /v1/responses", srv, modelProc, 25, 511, status(200))
	b.span(mr, "gym.model.responses", in, modelProc, 25.1, 510.5, rid)
	c4 := b.span(ag, "HTTP POST", cli, agentProc, 513, 690, urlAttr("http://127.0.0.1:8003/get_weather"), status(500))
	b.span(c4, "POST /get_weather", srv, resProc, 514, 689, status(500))
	b.out[len(b.out)-1].Status, b.out[len(b.out)-1].StatusMsg = codes.Error, "HTTP 500"
	c5 := b.span(ro, "HTTP POST", cli, agentProc, 701, 810, urlAttr("http://127.0.0.1:8003/verify"), status(200))
	vr := b.span(c5, "POST /verify", srv, resProc, 702, 809, status(200))
	b.span(vr, "gym.verify", in, resProc, 702.5, 808, rid)
	// Children end first: deliver in end order, as the span builder does.
	out := b.out
	for i := 0; i < len(out); i++ {
		for j := i + 1; j < len(out); j++ {
			if out[j].End.Before(out[i].End) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestTreeGolden(t *testing.T) {
	var buf bytes.Buffer
	tr := newTree(&buf, TreeConfig{Grace: 500 * time.Millisecond, IdleTimeout: 5 * time.Second, MaxSpans: 1000, Logger: nil})
	tr.log = testLogger(t)
	now := time.Unix(1_700_000_000, 0)
	base := now.Add(-time.Second)

	roll := sampleRollout(base)
	// The rollout arrives in two batches; the root in the second.
	tr.add(now, roll[:8])
	tr.flushDue(now.Add(time.Second))
	if buf.Len() != 0 {
		t.Fatalf("printed before the root ended:\n%s", buf.String())
	}
	tr.add(now.Add(time.Second), roll[8:])
	tr.flushDue(now.Add(1200 * time.Millisecond))
	if buf.Len() != 0 {
		t.Fatalf("printed within the grace period:\n%s", buf.String())
	}
	// With the server group off, gym.verify is a root on its own.
	vb := &rolloutBuilder{trace: tid("0af7651916cd43dd8448eb211c80319c"), base: base}
	vb.span(trace.SpanID{}, "gym.verify", trace.SpanKindInternal, resProc, 0, 0.35)
	tr.add(now.Add(time.Second), vb.out)
	tr.flushDue(now.Add(1600 * time.Millisecond))

	// A model call whose caller is not traced and which never got its root,
	// and one span still open at shutdown.
	ob := &rolloutBuilder{trace: tid("11112222333344445555666677778888"), base: base}
	ob.next = 0x100
	parent := ob.span(sid("aaaaaaaaaaaaaaaa"), "POST /v1/chat/completions", trace.SpanKindServer, modelProc, 100, 1400, status(200))
	ob.span(parent, "gym.model.chat_completions", trace.SpanKindInternal, modelProc, 101, 1399,
		attribute.Bool("nemo.span.truncated", true))
	tr.add(now.Add(2*time.Second), ob.out)
	tr.flushDue(now.Add(3 * time.Second))
	tr.Shutdown(context.Background())

	got := buf.String()
	golden := filepath.Join("testdata", "tree.golden")
	if *update {
		os.WriteFile(golden, []byte(got), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestTreeGolden -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("tree output differs from %s (-update to accept):\n--- got ---\n%s\n--- want ---\n%s", golden, got, want)
	}
	if tr.held != 0 || len(tr.traces) != 0 {
		t.Errorf("held %d spans in %d traces after shutdown", tr.held, len(tr.traces))
	}
}

// A trace whose parent lives in an untraced process prints after IdleTimeout.
func TestTreeIdleTraceWithoutRoot(t *testing.T) {
	var buf bytes.Buffer
	tr := newTree(&buf, TreeConfig{Grace: 100 * time.Millisecond, IdleTimeout: time.Second, MaxSpans: 100})
	tr.log = testLogger(t)
	now := time.Now()
	b := &rolloutBuilder{trace: tid("99999999999999999999999999999999"), base: now}
	b.span(sid("aaaaaaaaaaaaaaaa"), "POST /verify", trace.SpanKindServer, resProc, 0, 3)
	tr.add(now, b.out)
	tr.flushDue(now.Add(900 * time.Millisecond))
	if buf.Len() != 0 {
		t.Fatal("printed before the idle timeout")
	}
	tr.flushDue(now.Add(1100 * time.Millisecond))
	if !strings.Contains(buf.String(), "POST /verify") || !strings.Contains(buf.String(), "[no root seen]") {
		t.Fatalf("idle trace not printed:\n%s", buf.String())
	}
}

// Past MaxSpans the oldest trace is printed early: memory stays bounded.
func TestTreeBoundedMemory(t *testing.T) {
	var buf bytes.Buffer
	tr := newTree(&buf, TreeConfig{Grace: time.Hour, IdleTimeout: time.Hour, MaxSpans: 20})
	tr.log = testLogger(t)
	now := time.Now()
	for i := range 10 {
		b := &rolloutBuilder{trace: tid(fmt.Sprintf("%032x", i+1)), base: now}
		p := b.span(sid("aaaaaaaaaaaaaaaa"), "POST /x", trace.SpanKindServer, resProc, 0, 3)
		b.span(p, "gym.verify", trace.SpanKindInternal, resProc, 1, 2)
		b.span(p, "gym.verify", trace.SpanKindInternal, resProc, 1, 2)
		tr.add(now.Add(time.Duration(i)*time.Millisecond), b.out)
		if tr.held > 20 {
			t.Fatalf("holding %d spans, bound 20", tr.held)
		}
	}
	if !strings.Contains(buf.String(), "printed early") {
		t.Fatalf("nothing printed early:\n%s", buf.String())
	}
}

func TestTreeExporterRunsItsTimer(t *testing.T) {
	var buf syncBuffer
	tr := NewTree(&buf, TreeConfig{Grace: 50 * time.Millisecond})
	defer tr.Shutdown(context.Background())
	tr.Export(context.Background(), sampleRollout(time.Now()))
	waitFor(t, 30*time.Second, "the rollout to print", func() bool { return strings.Contains(buf.String(), "rollout 3-0") })
}
