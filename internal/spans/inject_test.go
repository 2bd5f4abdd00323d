//go:build linux

package spans

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// fakeInjector records what the Builder publishes for the kernel.
type fakeInjector struct {
	pub  map[[2]uint64]published
	gone [][2]uint64
}

type published struct {
	trace   trace.TraceID
	parent  trace.SpanID
	sampled bool
}

func (f *fakeInjector) Publish(conn, seq uint64, tid trace.TraceID, parent trace.SpanID, sampled bool) {
	f.pub[[2]uint64{conn, seq}] = published{tid, parent, sampled}
}

func (f *fakeInjector) Unpublish(conn, seq uint64) {
	delete(f.pub, [2]uint64{conn, seq})
	f.gone = append(f.gone, [2]uint64{conn, seq})
}

func (f *fakeInjector) PublishJob(pid uint32, tid trace.TraceID, job trace.SpanID, sampled bool) {
	f.Publish(0, uint64(pid), tid, job, sampled)
}

func (f *fakeInjector) UnpublishJob(pid uint32) { f.Unpublish(0, uint64(pid)) }

func newInjectSim(t *testing.T, spec string) (*sim, *fakeInjector) {
	t.Helper()
	s := newSim(t, spec)
	f := &fakeInjector{pub: map[[2]uint64]published{}}
	b, err := NewBuilder(Options{
		Mask:   s.mask,
		Lookup: func(pid int) *discover.Process { return s.procs[uint32(pid)] },
		IDs:    &SequentialIDs{},
		Clock:  http.NewClockWithOffset(time.Duration(1_700_000_000) * time.Second),
		Inject: f,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.b, s.p = b, NewPipeline(http.NewAssembler(http.AssemblerOptions{}), b)
	return s, f
}

// withInjected marks a request's traceparent as inserted by the kernel.
func withInjected(tp string) reqOpt {
	return func(ev *loader.HTTPEvent) {
		withTraceparent(tp)(ev)
		if ev.Side == loader.SideClient {
			ev.Flags |= loader.FlagInjected
		}
	}
}

func spanID(n uint64) trace.SpanID {
	return trace.SpanID{0xaa, 0, 0, 0, 0, 0, byte(n >> 8), byte(n)}
}

// The Builder publishes, for an inbound request, the trace and the innermost
// span a call of its handler hangs under; a call whose header the kernel
// inserted becomes the CLIENT span with exactly that id; the next hop joins
// it in-band; the entry goes when the exchange ends.
func TestInjectPublishAndUseInjectedID(t *testing.T) {
	s, f := newInjectSim(t, "per_rollout")
	run := s.dial(pidCollector, pidAgent, agentAddr)
	runCall := run.request(loader.MethodPOST, "/run")
	key := [2]uint64{run.srvConn, 0}
	p, ok := f.pub[key]
	if !ok {
		t.Fatalf("nothing published for the agent's /run: %v", f.pub)
	}
	tp := FormatTraceparent(p.trace, spanID(7), p.sampled)
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/seed_session", withInjected(tp)).respond(200)
	runCall.respond(200)

	if _, still := f.pub[key]; still {
		t.Errorf("the /run entry was not unpublished when its exchange ended")
	}
	cli := findSpans(s.spans, "HTTP POST")
	if len(cli) != 1 || cli[0].SpanID != spanID(7) || cli[0].TraceID != p.trace || cli[0].Parent != p.parent {
		t.Fatalf("CLIENT span %v: want id %v in trace %v under %v", cli, spanID(7), p.trace, p.parent)
	}
	if g := findSpans(s.spans, "gym.rollout"); len(g) != 1 || g[0].SpanID != p.parent {
		t.Errorf("published parent %v is not the gym.rollout span %v", p.parent, g)
	}
	srv := findSpans(s.spans, "POST /seed_session")
	if len(srv) != 1 || srv[0].Parent != spanID(7) || srv[0].TraceID != p.trace {
		t.Errorf("the next hop does not hang under the injected span: %v", srv)
	}
	if st := s.b.Stats(); st.Injected != 1 || st.OwnTraceparent != 0 || st.InjectMismatch != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A process that never served starts traces: the kernel's new trace id is
// taken, with its sampled bit.
func TestInjectedRootAdopted(t *testing.T) {
	s, _ := newInjectSim(t, "server,http_client")
	s.traced[pidCollector] = true
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run",
		withInjected(FormatTraceparent(tid, spanID(9), true))).respond(200)
	cli := findSpans(s.spans, "HTTP POST")
	srv := findSpans(s.spans, "POST /run")
	if len(cli) != 1 || cli[0].TraceID != tid || cli[0].SpanID != spanID(9) || cli[0].Parent.IsValid() {
		t.Fatalf("root CLIENT span %v: want id %v, trace %v, no parent", cli, spanID(9), tid)
	}
	if len(srv) != 1 || srv[0].TraceID != tid || srv[0].Parent != spanID(9) {
		t.Errorf("SERVER span %v does not join the injected root", srv)
	}
	if st := s.b.Stats(); st.InjectAdopted != 1 {
		t.Errorf("InjectAdopted = %d", st.InjectAdopted)
	}
}

// When the wire names another trace than the parent's (the parent's trace
// changed after the kernel read it), the CLIENT span follows the wire, so the
// hops after it stay joined to it.
func TestInjectedMismatchFollowsTheWire(t *testing.T) {
	s, _ := newInjectSim(t, "server,http_client")
	run := s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run")
	other := trace.TraceID{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/x",
		withInjected(FormatTraceparent(other, spanID(3), true))).respond(200)
	run.respond(200)
	cli := findSpans(s.spans, "HTTP POST")
	if len(cli) != 1 || cli[0].TraceID != other || cli[0].SpanID != spanID(3) {
		t.Fatalf("CLIENT span %v: want the wire's trace %v and id", cli, other)
	}
	mustAttr(t, cli[0], "gymtrace.parent.unresolved", "injected_trace_mismatch")
	if st := s.b.Stats(); st.InjectMismatch != 1 {
		t.Errorf("InjectMismatch = %d", st.InjectMismatch)
	}
}

// A late connection join moves a published server request into its client's
// trace: the Builder publishes again.
func TestInjectRetraceOnLateJoin(t *testing.T) {
	s, f := newInjectSim(t, "server,http_client")
	s.traced[pidCollector] = true
	s.lateCli = true
	c := s.dial(pidCollector, pidAgent, agentAddr)
	k := c.request(loader.MethodPOST, "/run")
	p := f.pub[[2]uint64{c.srvConn, 0}]
	k.respond(200)
	cli := findSpans(s.spans, "HTTP POST")
	if len(cli) != 1 || p.trace != cli[0].TraceID {
		t.Errorf("published trace %v, the joined trace is %v", p.trace, cli)
	}
	if st := s.b.Stats(); st.Retraced != 1 || st.LateJoins != 1 {
		t.Errorf("stats %+v", st)
	}
}

// A collector's gym.job ids are published before its first call and used
// when the job span starts, so even the first calls carry the job's trace.
func TestPrepareJob(t *testing.T) {
	s, f := newInjectSim(t, "job,server,http_client")
	s.traced[pidCollector] = true
	s.procs[pidCollector] = &discover.Process{PID: pidCollector, Role: loader.RoleOrchestrator}
	s.b.PrepareJob(pidCollector)
	p, ok := f.pub[[2]uint64{0, pidCollector}]
	if !ok {
		t.Fatalf("PrepareJob published nothing: %v", f.pub)
	}
	tp := FormatTraceparent(p.trace, spanID(5), p.sampled)
	s.dial(pidCollector, pidAgent, agentAddr).request(loader.MethodPOST, "/run", withInjected(tp)).respond(200)
	s.b.ForgetProcess(pidCollector)
	spans := append(s.spans, s.b.Flush()...)
	cli := findSpans(spans, "HTTP POST")
	job := findSpans(spans, "gym.job")
	if len(job) != 1 || job[0].SpanID != p.parent || job[0].TraceID != p.trace {
		t.Fatalf("gym.job %v: want the published ids %v/%v", job, p.trace, p.parent)
	}
	if len(cli) != 1 || cli[0].Parent != p.parent || cli[0].SpanID != spanID(5) || cli[0].TraceID != p.trace {
		t.Errorf("the first /run call %v is not the injected span under the job", cli)
	}
	if _, still := f.pub[[2]uint64{0, pidCollector}]; still {
		t.Errorf("the job entry outlived its process")
	}
}

// withKernelTrace marks a server request for which the kernel started and
// published a trace (bpf/inject.h, gt_inject_root).
func withKernelTrace(tid trace.TraceID, sampled bool) reqOpt {
	return func(ev *loader.HTTPEvent) {
		if ev.Side != loader.SideServer {
			return
		}
		ev.Flags |= loader.FlagKernelTrace
		copy(ev.Traceparent[:16], tid[:])
		ev.Traceparent[16] = 0
		if sampled {
			ev.Traceparent[16] = 1
		}
	}
}

// A request without traceparent in a process whose calls are injected: the
// kernel started its trace and published it, so the Builder gives the root
// span that trace, publishes nothing itself, and deletes the entry when the
// exchange ends.
func TestKernelStartedTraceAdopted(t *testing.T) {
	s, f := newInjectSim(t, "per_rollout")
	s.midStream = true // no join wait: the collector is not traced
	tid := trace.TraceID{0xa1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	run := s.dial(pidCollector, pidAgent, agentAddr)
	call := run.request(loader.MethodPOST, "/run", withKernelTrace(tid, true))
	key := [2]uint64{run.srvConn, 0}
	if p, ok := f.pub[key]; ok {
		t.Errorf("the Builder published %v over the kernel's own trace", p)
	}
	call.respond(200)
	srv := findSpans(s.spans, "POST /run")
	if len(srv) != 1 || srv[0].TraceID != tid || srv[0].Parent.IsValid() {
		t.Fatalf("/run span %v: want a root in the kernel's trace %v", srv, tid)
	}
	if g := findSpans(s.spans, "gym.rollout"); len(g) != 1 || g[0].TraceID != tid {
		t.Errorf("gym.rollout %v not in the kernel's trace", g)
	}
	if len(f.gone) != 1 || f.gone[0] != key {
		t.Errorf("entries deleted: %v, want the /run's", f.gone)
	}
}

// When the sampler does not confirm the kernel's sampled bit, userspace's
// decision is published over the kernel's.
func TestKernelStartedTraceSampledDisagreement(t *testing.T) {
	s, f := newInjectSim(t, "per_rollout")
	tid := trace.TraceID{0xb2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	run := s.dial(pidCollector, pidAgent, agentAddr)
	run.request(loader.MethodPOST, "/run", withKernelTrace(tid, false))
	p, ok := f.pub[[2]uint64{run.srvConn, 0}]
	if !ok || p.trace != tid || !p.sampled {
		t.Fatalf("published %v (%v), want the kernel's trace with the sampler's bit", p, ok)
	}
	if st := s.b.Stats(); st.KernelTraceDisagreed != 1 {
		t.Errorf("KernelTraceDisagreed = %d", st.KernelTraceDisagreed)
	}
}
