//go:build linux

package spans

import (
	"testing"

	"github.com/gymtrace/gymtrace/internal/loader"
)

func withTLS() reqOpt { return func(ev *loader.HTTPEvent) { ev.Flags |= loader.FlagTLS } }

// Exchanges the kernel read through the OpenSSL probes (GT_F_TLS) are https.
func TestTLSExchangesAreHTTPS(t *testing.T) {
	s := newSim(t, "server,http_client")
	s.traced[pidModel] = false // the upstream LLM endpoint is not traced
	c := s.dial(pidAgent, pidModel, "10.0.0.9:443")
	c.host = "api.example.com"
	c.request(loader.MethodPOST, "/v1/chat/completions", withTLS()).respondFlags(200, 0, loader.FlagTLS|loader.FlagChunked)
	if len(s.spans) != 1 {
		t.Fatalf("%d spans, want the client span", len(s.spans))
	}
	sp := s.spans[0]
	mustAttr(t, sp, "url.full", "https://api.example.com/v1/chat/completions")
	mustAttr(t, sp, "server.address", "api.example.com")
	mustAttr(t, sp, "server.port", 443)

	// A traced HTTPS server: url.scheme says so.
	s = newSim(t, "server")
	s.traced[pidAgent] = false
	c = s.dial(pidAgent, pidModel, "127.0.0.1:8443")
	c.request(loader.MethodPOST, "/v1/responses", withTLS()).respondFlags(200, loader.FlagTLS, 0)
	for _, sp := range s.spans {
		if _, ok := attr(sp, "url.scheme"); ok {
			mustAttr(t, sp, "url.scheme", "https")
			return
		}
	}
	t.Fatal("no span with url.scheme")
}
