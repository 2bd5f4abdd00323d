//go:build linux

package spans

import (
	"net/netip"
	"strconv"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gymtrace/gymtrace/internal/discover"
	"github.com/gymtrace/gymtrace/internal/http"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// Span attributes: url scheme, server authority, addresses, Gym's own keys.

// scheme is "https" when the kernel read the exchange as TLS plaintext
// (OpenSSL probes, internal/tls), else "http".
func scheme(x *http.Exchange) string {
	if x.Flags()&loader.FlagTLS != 0 {
		return "https"
	}
	return "http"
}

func (b *Builder) appendGym(attrs []attribute.KeyValue, p *discover.Process, rollout string) []attribute.KeyValue {
	if p.ServerName != "" {
		attrs = append(attrs, attribute.String("nemo.gym.server.name", p.ServerName))
	}
	if rollout != "" {
		attrs = append(attrs, attribute.String("nemo.gym.rollout.id", rollout))
	}
	return attrs
}

func appendAddr(attrs []attribute.KeyValue, prefix string, ap netip.AddrPort) []attribute.KeyValue {
	if !ap.IsValid() {
		return attrs
	}
	return append(attrs,
		attribute.String(prefix+".address", ap.Addr().String()),
		attribute.Int(prefix+".port", int(ap.Port())))
}

// serverAuthority is the server a client request addressed: the Host header
// when it is well formed, else the connection's remote end.
func serverAuthority(x *http.Exchange) (string, int) {
	remotePort := int(x.Remote.Port())
	if h := x.Host; h != "" && validHost(h) {
		if ap, err := netip.ParseAddrPort(h); err == nil {
			return ap.Addr().String(), int(ap.Port())
		}
		if h[0] == '[' { // "[::1]" without a port
			if a, err := netip.ParseAddr(h[1 : len(h)-1]); err == nil && h[len(h)-1] == ']' {
				return a.String(), remotePort
			}
			return x.Remote.Addr().String(), remotePort
		}
		if i := lastColon(h); i >= 0 {
			if p, err := strconv.Atoi(h[i+1:]); err == nil && p > 0 && p < 65536 {
				return h[:i], p
			}
			return x.Remote.Addr().String(), remotePort
		}
		return h, remotePort
	}
	return x.Remote.Addr().String(), remotePort
}

func lastColon(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ':' {
			return i
		}
	}
	return -1
}

// hostPort renders url.full's authority: the Host header as sent when it is
// well formed, else address:port.
func hostPort(host string, port int, hdr string) string {
	if hdr != "" && validHost(hdr) {
		return hdr
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// validHost accepts the characters of a host[:port] authority and nothing
// that could smuggle text into a URL (spaces, '/', '@', '?', '#', controls).
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '-', c == '_', c == ':', c == '[', c == ']', c == '%', c == '~':
		default:
			return false
		}
	}
	return len(h) > 0
}
