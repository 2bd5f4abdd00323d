//go:build linux

package spans

// ActiveRequest is one inbound request in flight that has a SERVER span.
type ActiveRequest struct {
	PID            uint32
	Method, Scheme string
	Local          string // the server's address
	Port           int
	Host           string // its Host header as sent
}

// ActiveServer calls yield for every inbound request in flight that has a
// SERVER span (the server group was on when it began): what the HTTP
// server's active-requests metric counts. It runs under the Builder's lock,
// so yield must be quick and must not call the Builder.
func (b *Builder) ActiveServer(yield func(ActiveRequest)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for pid, list := range b.inflight {
		for _, in := range list {
			if in.server == nil || in.done {
				continue
			}
			x := in.x
			yield(ActiveRequest{PID: pid, Method: x.Method, Scheme: scheme(x),
				Local: x.Local.Addr().String(), Port: int(x.Local.Port()), Host: x.Host})
		}
	}
}
