package spans

import (
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// A request line the server read in pieces: its record's path is "/v" of
// "/verify", flagged incomplete (FlagPathTruncated). The SERVER span is
// named by the method alone, says so, carries no url.path or http.route,
// opens no gym.* span, and is not joined to the client that sent /verify.
func TestIncompletePathNamesNoRoute(t *testing.T) {
	s := newSim(t, "server,verify,http_client")
	cut := func(ev *loader.HTTPEvent) {
		if ev.Side == loader.SideServer {
			ev.PathLen = uint16(copy(ev.Path[:], "/v"))
			ev.Flags |= loader.FlagPathTruncated
		}
	}
	s.dial(pidAgent, pidResources, resAddr).request(loader.MethodPOST, "/verify", withStream(7), cut).respond(200)
	s.spans = append(s.spans, s.p.Flush()...)
	var server, client *Span
	for i := range s.spans {
		switch s.spans[i].Kind {
		case trace.SpanKindServer:
			server = &s.spans[i]
		case trace.SpanKindClient:
			client = &s.spans[i]
		default:
			t.Errorf("unexpected span %s", desc(s.spans[i]))
		}
	}
	if server == nil || client == nil {
		t.Fatalf("spans %d, want a SERVER and a CLIENT span", len(s.spans))
	}
	if server.Name != "POST" {
		t.Errorf("server span %q, want POST", server.Name)
	}
	mustAttr(t, *server, "gymtrace.path.incomplete", true)
	noAttr(t, *server, "url.path")
	noAttr(t, *server, "http.route")
	if server.Parent == client.SpanID {
		t.Error("the server span with a part of a path is joined to the /verify client span")
	}
	mustAttr(t, *client, "url.full", "http://"+resAddr+"/verify")
}
