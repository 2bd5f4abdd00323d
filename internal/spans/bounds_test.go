//go:build linux

package spans

import (
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymtrace/gymtrace/internal/http"
)

// A joined SERVER span lies inside its CLIENT span even when a large
// syscall's exit made one end's times trail the other's (bigrequest,
// bigresponse in the kernel scenarios).
func TestServerBounds(t *testing.T) {
	client := &node{id: trace.SpanID{1, 2, 3}}
	joined := func(sStart, sEnd, cStart, cEnd uint64) *inbound {
		return &inbound{
			x:      &http.Exchange{ReqStart: sStart, RespEnd: sEnd},
			server: &node{parent: client},
			via:    &outbound{x: &http.Exchange{ReqStart: cStart, RespEnd: cEnd}, client: client},
		}
	}
	for _, c := range []struct {
		name       string
		in         *inbound
		start, end uint64
	}{
		{"inside already", joined(110, 190, 100, 200), 110, 190},
		{"upload: the client's write exits after the server's read", joined(100, 190, 150, 200), 150, 190},
		{"download: the client's read exits before the server's write", joined(110, 250, 100, 200), 110, 200},
		{"client not finished: its end is not known", joined(100, 250, 150, 0), 150, 250},
		{"client started after the server ended: nothing sane to clamp to", joined(100, 120, 150, 200), 100, 120},
		{"not joined", &inbound{x: &http.Exchange{ReqStart: 100, RespEnd: 190}, server: &node{}}, 100, 190},
		{"parented by a traceparent, not by the client on this node",
			&inbound{x: &http.Exchange{ReqStart: 100, RespEnd: 190}, server: &node{remote: trace.SpanID{9}},
				via: &outbound{x: &http.Exchange{ReqStart: 150, RespEnd: 200}, client: client}}, 100, 190},
		{"parented by the traceparent gymtrace injected: the client on this node's own id",
			&inbound{x: &http.Exchange{ReqStart: 100, RespEnd: 250}, server: &node{remote: client.id},
				via: &outbound{x: &http.Exchange{ReqStart: 150, RespEnd: 200}, client: client}}, 150, 200},
		{"no parent at all", &inbound{x: &http.Exchange{ReqStart: 100, RespEnd: 190}, server: &node{},
			via: &outbound{x: &http.Exchange{ReqStart: 150, RespEnd: 200}, client: &node{}}}, 100, 190},
	} {
		if s, e := serverBounds(c.in); s != c.start || e != c.end {
			t.Errorf("%s: span [%d, %d], want [%d, %d]", c.name, s, e, c.start, c.end)
		}
	}
}
