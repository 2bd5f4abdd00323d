package gymmetrics

import (
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
)

// Semconv is which HTTP semantic conventions the HTTP metrics follow, as
// OTEL_SEMCONV_STABILITY_OPT_IN chooses them for Gym's FastAPI
// instrumentation (opentelemetry-instrumentation 0.65b0): the old ones unless
// it lists "http" (the stable ones) or "http/dup" (both).
type Semconv uint8

const (
	SemconvOld Semconv = 1 << iota // http.server.duration (ms), http.method, http.status_code, ...
	SemconvNew                     // http.server.request.duration (s), http.request.method, ...
	SemconvDup = SemconvOld | SemconvNew
)

// SemconvFromEnv reads OTEL_SEMCONV_STABILITY_OPT_IN's value as the Python
// instrumentation does: a comma-separated list; "http/dup" wins over "http".
func SemconvFromEnv(v string) Semconv {
	mode := SemconvOld
	for _, f := range strings.Split(v, ",") {
		switch strings.TrimSpace(strings.ToLower(f)) {
		case "http/dup":
			return SemconvDup
		case "http":
			mode = SemconvNew
		}
	}
	return mode
}

// String names the mode as the variable spells it.
func (s Semconv) String() string {
	switch s {
	case SemconvNew:
		return "http"
	case SemconvDup:
		return "http/dup"
	}
	return "old"
}

// Instrument names and units: Gym's (nemo_gym/telemetry/metrics.py), the
// FastAPI/ASGI instrumentation's, and gymtrace's additions (the reward, the
// client duration).
const (
	RolloutDuration = "gym.rollout.duration_ms"
	VerifyDuration  = "gym.verify.duration_ms"
	VerifySuccess   = "gym.verify.success_rate"
	VerifyReward    = "gym.verify.reward"
	ServersActive   = "gym.servers.active"

	ServerDurationOld = "http.server.duration"
	ServerDurationNew = "http.server.request.duration"
	ServerActive      = "http.server.active_requests"
	ServerReqSizeOld  = "http.server.request.size"
	ServerRespSizeOld = "http.server.response.size"
	ServerReqSizeNew  = "http.server.request.body.size"
	ServerRespSizeNew = "http.server.response.body.size"
	ClientDurationOld = "http.client.duration"
	ClientDurationNew = "http.client.request.duration"
)

// exchange is what the HTTP metrics read of one SERVER or CLIENT span.
type exchange struct {
	method, scheme, route string
	status                int    // 0: no response
	errType               string // error.type, "" when none
	addr                  string // server.address (the local address of a SERVER span)
	port                  int
	host                  string // the Host header as sent (old http.server_name, http.host)
}

// serverDurationAttrs are the attributes of the server duration and size
// histograms in one convention: the keys the ASGI instrumentation keeps
// (_server_duration_attrs_old/_new). The old ones name the route by
// http.target (FastAPI's route template), not http.route.
func serverDurationAttrs(e *exchange, s Semconv) []attribute.KeyValue {
	if s == SemconvNew {
		a := []attribute.KeyValue{
			attribute.String("http.request.method", e.method),
			attribute.String("url.scheme", e.scheme),
			attribute.String("network.protocol.version", "1.1"),
		}
		if e.route != "" {
			a = append(a, attribute.String("http.route", e.route))
		}
		return appendStable(a, e, 500)
	}
	a := []attribute.KeyValue{
		attribute.String("http.method", e.method),
		attribute.String("http.scheme", e.scheme),
		attribute.String("http.flavor", "1.1"),
		attribute.String("http.host", hostPort(e.addr, e.port)),
		attribute.Int("net.host.port", e.port),
	}
	if e.host != "" {
		a = append(a, attribute.String("http.server_name", e.host))
	}
	if e.route != "" {
		a = append(a, attribute.String("http.target", e.route))
	}
	if e.status > 0 {
		a = append(a, attribute.Int("http.status_code", e.status))
	}
	return a
}

// activeAttrs are the attributes of http.server.active_requests
// (_server_active_requests_count_attrs_old/_new). With http/dup there is one
// instrument, with both sets of keys.
func activeAttrs(a *Active, s Semconv) []attribute.KeyValue {
	var kv []attribute.KeyValue
	if s&SemconvOld != 0 {
		kv = append(kv,
			attribute.String("http.method", a.Method),
			attribute.String("http.scheme", a.Scheme),
			attribute.String("http.flavor", "1.1"),
			attribute.String("http.host", hostPort(a.Addr, a.Port)))
		if a.Host != "" {
			kv = append(kv, attribute.String("http.server_name", a.Host))
		}
	}
	if s&SemconvNew != 0 {
		kv = append(kv,
			attribute.String("http.request.method", a.Method),
			attribute.String("url.scheme", a.Scheme))
	}
	return kv
}

// clientDurationAttrs are the attributes of the client duration histogram
// as the aiohttp-client instrumentation records them
// (_client_duration_attrs_old/_new): by the server the call addressed.
func clientDurationAttrs(e *exchange, s Semconv) []attribute.KeyValue {
	if s == SemconvNew {
		a := []attribute.KeyValue{
			attribute.String("http.request.method", e.method),
			attribute.String("server.address", e.addr),
			attribute.Int("server.port", e.port),
		}
		return appendStable(a, e, 400)
	}
	a := []attribute.KeyValue{
		attribute.String("http.method", e.method),
		attribute.String("http.host", e.addr),
		attribute.String("net.peer.name", e.addr),
		attribute.Int("net.peer.port", e.port),
	}
	if e.status > 0 {
		a = append(a, attribute.Int("http.status_code", e.status))
	}
	return a
}

// appendStable adds the stable conventions' status and error.type: the
// connection's failure, else the status code from errFrom on (5xx for a
// server, 4xx too for a client, as the instrumentations set span status).
func appendStable(a []attribute.KeyValue, e *exchange, errFrom int) []attribute.KeyValue {
	if e.status > 0 {
		a = append(a, attribute.Int("http.response.status_code", e.status))
	}
	switch {
	case e.errType != "":
		a = append(a, attribute.String("error.type", e.errType))
	case e.status >= errFrom:
		a = append(a, attribute.String("error.type", strconv.Itoa(e.status)))
	}
	return a
}

// hostPort is the old http.host: the server's address and port, without
// the port when it is 80, and an IPv6 address without brackets, as the
// ASGI instrumentation joins scope["server"].
func hostPort(addr string, port int) string {
	if port == 80 {
		return addr
	}
	return addr + ":" + strconv.Itoa(port)
}
