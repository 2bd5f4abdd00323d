//go:build linux

package spans

import (
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/loader"
)

const tpSampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
const tpUnsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"

func TestTraceparentHonoured(t *testing.T) {
	// The collector is untraced; its request carries a traceparent (Gym's
	// own telemetry, or another node's gymtrace).
	for _, spec := range []string{"per_rollout", "rollout,http_client"} {
		t.Run(spec, func(t *testing.T) {
			s := newSim(t, spec)
			c := s.dial(pidCollector, pidAgent, agentAddr)
			run := c.request(loader.MethodPOST, "/run", withTraceparent(tpSampled))
			s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/seed_session").respond(200)
			run.respond(200)
			want, _ := ParseTraceparent(tpSampled)
			for _, sp := range s.spans {
				if sp.TraceID != want.TraceID() {
					t.Errorf("%s: trace %v, want the traceparent's", desc(sp), sp.TraceID)
				}
			}
			top := findSpans(s.spans, "POST /run")
			if spec != "per_rollout" {
				top = findSpans(s.spans, "gym.rollout") // with server off it takes the server span's place
			}
			if len(top) != 1 || top[0].Parent != want.SpanID() {
				t.Fatalf("top span's parent is not the traceparent's span id: %v", top)
			}
			if st := s.b.Stats(); st.JoinedTraceparent != 1 {
				t.Errorf("JoinedTraceparent = %d", st.JoinedTraceparent)
			}
		})
	}
}

// An in-band traceparent wins over the same-node connection join.
func TestTraceparentBeatsTupleJoin(t *testing.T) {
	s := newSim(t, "server,http_client")
	c := s.dial(pidAgent, pidResources, resAddr)
	c.request(loader.MethodPOST, "/x", withTraceparent(tpSampled)).respond(200)
	want, _ := ParseTraceparent(tpSampled)
	for _, sp := range s.spans {
		if sp.TraceID != want.TraceID() || sp.Parent != want.SpanID() {
			t.Errorf("%s: trace %v parent %v; want the header's", desc(sp), sp.TraceID, sp.Parent)
		}
	}
	if st := s.b.Stats(); st.OwnTraceparent != 1 || st.JoinedTraceparent != 1 || st.JoinedTuple != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestUnsampledTraceparentRespected(t *testing.T) {
	s := newSim(t, "per_rollout")
	c := s.dial(pidCollector, pidAgent, agentAddr)
	run := c.request(loader.MethodPOST, "/run", withTraceparent(tpUnsampled))
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify").respond(200)
	run.respond(200)
	if len(s.spans) != 0 {
		t.Fatalf("an unsampled incoming trace produced %d spans: %v", len(s.spans), edges(t, s.spans))
	}
	if st := s.b.Stats(); st.Unsampled != 5 {
		t.Errorf("Unsampled = %d, want 5", st.Unsampled)
	}
}

func TestBadTraceparentIgnored(t *testing.T) {
	s := newSim(t, "server")
	c := s.dial(pidCollector, pidAgent, agentAddr)
	c.request(loader.MethodPOST, "/run", withTraceparent(strings.ToUpper(tpSampled))).respond(200)
	if len(s.spans) != 1 || s.spans[0].Parent.IsValid() {
		t.Fatalf("spans %v", edges(t, s.spans))
	}
	if s.b.Stats().BadTraceparent != 1 {
		t.Error("bad traceparent not counted")
	}
}

func TestSamplerRatio(t *testing.T) {
	s := newSim(t, "default")
	s.b.opt.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0))
	g := newGymStack(s, false)
	g.rollout(0, 1, 1)
	if len(s.spans) != 0 {
		t.Fatalf("ratio 0 exported %d spans", len(s.spans))
	}
	s2 := newSim(t, "default")
	s2.b.opt.Sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(1))
	newGymStack(s2, false).rollout(0, 1, 1)
	if len(s2.spans) != len(rolloutTrees["default"]) {
		t.Fatalf("ratio 1 exported %d spans, want %d", len(s2.spans), len(rolloutTrees["default"]))
	}
}

func TestParseTraceparent(t *testing.T) {
	good := []string{
		tpSampled,
		tpUnsampled,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
		"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
	}
	for _, s := range good {
		sc, ok := ParseTraceparent(s)
		if !ok || !sc.IsRemote() || !sc.IsValid() {
			t.Errorf("%q rejected", s)
		}
	}
	if sc, _ := ParseTraceparent(tpSampled); !sc.IsSampled() || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("parsed %v", sc)
	}
	bad := []string{
		"",
		tpSampled[:54],
		tpSampled + "-",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
	}
	for _, s := range bad {
		if _, ok := ParseTraceparent(s); ok {
			t.Errorf("%q accepted", s)
		}
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	if FormatTraceparent(tid, sid, true) != tpSampled || FormatTraceparent(tid, sid, false) != tpUnsampled {
		t.Error("FormatTraceparent does not round-trip")
	}
}

func FuzzParseTraceparent(f *testing.F) {
	f.Add(tpSampled)
	f.Add("00-")
	f.Fuzz(func(t *testing.T, s string) {
		sc, ok := ParseTraceparent(s)
		if !ok {
			return
		}
		if !sc.IsValid() {
			t.Fatal("accepted an invalid span context")
		}
		// Only the sampled flag is kept; version 00 ids must round-trip.
		if s[:2] == "00" && FormatTraceparent(sc.TraceID(), sc.SpanID(), sc.IsSampled())[:53] != s[:53] {
			t.Fatalf("%q does not round-trip", s)
		}
	})
}
