//go:build linux

package agent

import (
	"log/slog"

	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
	gttls "github.com/gymtrace/gymtrace/internal/tls"
)

// tlsWanted: the OpenSSL probes feed client and server exchanges only. With
// both groups off no TLS probe is attached, so targets take no uprobe trap.
func tlsWanted(m groups.Mask) bool { return m.Has(groups.HTTPClient) || m.Has(groups.Server) }

// newTLSAttacher follows every target's OpenSSL copies (internal/tls).
func newTLSAttacher(kern *loader.Tracer, m groups.Mask, log *slog.Logger) (*gttls.Attacher, error) {
	a, err := gttls.NewAttacher(gttls.Programs(kern.TLSPrograms()), gttls.Options{Log: log})
	if err != nil {
		return nil, err
	}
	if why := tlsOff(kern); why != "" {
		log.Warn("HTTPS is not traced on this kernel", "why", why)
	}
	a.SetEnabled(tlsAllowed(kern, m))
	return a, nil
}

// tlsAllowed: wanted by the groups, and safe on this kernel.
func tlsAllowed(kern *loader.Tracer, m groups.Mask) bool {
	return tlsWanted(m) && tlsOff(kern) == ""
}

// tlsOff says why this kernel cannot run the TLS probes, or "".
func tlsOff(kern *loader.Tracer) string {
	if why := kern.FeatureOff(loader.FeatureTLS); why != "" {
		return why
	}
	return kern.Preemption().TLSUnsafe()
}
