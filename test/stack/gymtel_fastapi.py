"""Gym's own telemetry (gymtel.py): the shape of the FastAPI instrumentation,
written here because Debian does not package the contrib one. Imported only
by gymtel.py, after its check that the OpenTelemetry SDK is there.
"""

import urllib.parse
from timeit import default_timer

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.routing import Match, Route


def _decode(b):
    try:
        return b.decode("utf-8")
    except ValueError:
        return b.decode("unicode_escape")


class ScopeHeaders(Getter):
    """Header lookup in an ASGI scope or message, as the ASGI
    instrumentation does it (every header decoded on every lookup)."""

    def get(self, carrier, key):
        headers = carrier.get("headers")
        if not headers:
            return None
        key = key.lower()
        found = [_decode(v) for k, v in headers if _decode(k).lower() == key]
        return found or None

    def keys(self, carrier):
        return [_decode(k) for k, _ in carrier.get("headers") or []]


HEADERS = ScopeHeaders()
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})

# Old (default) semantic conventions: which request attributes each metric keeps.
DURATION_KEYS = ("http.method", "http.host", "http.scheme", "http.status_code", "http.flavor",
                 "http.server_name", "net.host.name", "net.host.port")
ACTIVE_KEYS = ("http.method", "http.host", "http.scheme", "http.flavor", "http.server_name")


def request_attributes(scope):
    """The SERVER span's attributes, old conventions (no
    OTEL_SEMCONV_STABILITY_OPT_IN, as Gym runs)."""
    server = scope.get("server") or ("0.0.0.0", 80)
    port = server[1]
    host_header = HEADERS.get(scope, "host")
    suffix = ":" + str(port) if str(port) != "80" else ""
    url_host = host_header[0] if host_header else server[0] + suffix
    path = scope.get("path", "")
    url = scope.get("scheme", "http") + "://" + url_host + path
    query = scope.get("query_string")
    if query:
        url += "?" + urllib.parse.unquote(query.decode("utf8") if isinstance(query, bytes) else query)
    method = scope.get("method", "")
    attrs = {
        "http.scheme": scope.get("scheme"),
        "http.host": server[0] + suffix,
        "net.host.port": port,
        "http.flavor": scope.get("http_version"),
        "http.target": path,
        "http.url": url,
        "http.method": method if method in KNOWN_METHODS else "_OTHER",
    }
    if host_header:
        attrs["http.server_name"] = ",".join(host_header)
    user_agent = HEADERS.get(scope, "user-agent")
    if user_agent:
        attrs["http.user_agent"] = user_agent[0]
    client = scope.get("client")
    if client is not None:
        attrs["net.peer.ip"] = client[0]
        attrs["net.peer.port"] = client[1]
    return {k: v for k, v in attrs.items() if v is not None}


def route_template(scope):
    """FastAPI instrumentation's _get_route_details: the first route of
    scope["app"] that matches fully, else the last partial match."""
    app = scope.get("app")
    found = None
    for r in getattr(app, "routes", ()):
        match, _ = Route.matches(r, scope) if isinstance(r, Route) else r.matches(scope)
        if match == Match.FULL:
            found = getattr(r, "path", scope.get("path"))
            break
        if match == Match.PARTIAL:
            found = r.path
    return found


def set_status_code(span, status, metric_attrs=None):
    if metric_attrs is not None:
        metric_attrs["http.status_code"] = status
    if span.is_recording():
        span.set_attribute("http.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))


class ServerSpans:
    """OpenTelemetryMiddleware as FastAPIInstrumentor installs it: around the
    whole middleware stack, ServerErrorMiddleware included."""

    def __init__(self, app, tel):
        self.app = app
        self.tracer = tel.tracer_provider.get_tracer("gymtel.fastapi")
        meter = tel.meter_provider.get_meter("gymtel.fastapi")
        self.duration = meter.create_histogram("http.server.duration", unit="ms",
                                               description="Measures the duration of inbound HTTP requests.")
        self.response_size = meter.create_histogram("http.server.response.size", unit="By",
                                                    description="measures the size of HTTP response messages (compressed).")
        self.request_size = meter.create_histogram("http.server.request.size", unit="By",
                                                   description="Measures the size of HTTP request messages (compressed).")
        self.active = meter.create_up_down_counter("http.server.active_requests", unit="{request}",
                                                   description="Number of active HTTP server requests.")

    async def __call__(self, scope, receive, send):
        start = default_timer()
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = route_template(scope)
        method = scope.get("method", "").strip()
        if method not in KNOWN_METHODS:
            method = "HTTP"
        name = f"{method} {route}" if route else method
        attrs = request_attributes(scope)
        if route:
            attrs["http.route"] = route
        # The inbound traceparent (and baggage) becomes the parent.
        ctx = propagate.extract(scope, getter=HEADERS)
        token = otel_context.attach(ctx)
        span = self.tracer.start_span(name, context=ctx, kind=SpanKind.SERVER, attributes=attrs)
        active_attrs = {k: attrs[k] for k in ACTIVE_KEYS if k in attrs}
        self.active.add(1, active_attrs)
        response_length = [None]
        try:
            with trace.use_span(span, end_on_exit=False) as current:
                if current.is_recording():
                    for k, v in attrs.items():
                        current.set_attribute(k, v)
                await self.app(scope, self._receive(name, receive), self._send(span, name, send, attrs, response_length))
        finally:
            r = scope.get("route")
            target = getattr(r, "path_format", None)
            duration_s = default_timer() - start
            metric_attrs = {k: attrs[k] for k in DURATION_KEYS if k in attrs}
            if target:
                metric_attrs["http.target"] = target
            span_ctx = trace.set_span_in_context(span)
            self.duration.record(max(round(duration_s * 1000), 0), metric_attrs, context=span_ctx)
            self.active.add(-1, active_attrs)
            if response_length[0]:
                self.response_size.record(response_length[0], metric_attrs, context=span_ctx)
            request_length = HEADERS.get(scope, "content-length")
            if request_length:
                try:
                    self.request_size.record(int(request_length[0]), metric_attrs, context=span_ctx)
                except ValueError:
                    pass
            otel_context.detach(token)
            if span.is_recording():
                span.end()

    def _receive(self, name, receive):
        span_name = f"{name} http receive"
        tracer = self.tracer

        async def otel_receive():
            with tracer.start_as_current_span(span_name) as s:
                message = await receive()
                if s.is_recording():
                    s.set_attribute("asgi.event.type", message["type"])
            return message

        return otel_receive

    def _send(self, server_span, name, send, attrs, response_length):
        span_name = f"{name} http send"
        tracer = self.tracer

        async def otel_send(message):
            status = message["status"] if message["type"] == "http.response.start" else None
            with tracer.start_as_current_span(span_name) as s:
                if s.is_recording():
                    s.set_attribute("asgi.event.type", message["type"])
                if status:
                    set_status_code(s, status)
            if status:
                set_status_code(server_span, status, attrs)
            length = HEADERS.get(message, "content-length")
            if length:
                try:
                    response_length[0] = int(length[0])
                except ValueError:
                    pass
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                server_span.end()

        return otel_send
