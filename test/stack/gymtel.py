"""Gym's own telemetry, in process, for the bench's "Gym telemetry" rows.

NeMo Gym users who want traces today switch on Gym's in-process OpenTelemetry
(nemo-lens over the OTel Python SDK). This module sets that up in the stack's
servers the way Gym does (its telemetry branch, nemo-lens b85578fc; see
/work/shared/reference/gym-facts.md), so gymtrace's cost can be held against
it on the same stack:

- a TracerProvider with an open-span closer (a span still open at shutdown is
  ended with nemo.span.truncated=true), then a BatchSpanProcessor (queue 2048,
  batch 512, 5 s); a MeterProvider with a PeriodicExportingMetricReader every
  10 s; W3C tracecontext + baggage propagators; resource service.name =
  nemo-gym/<server name> and Gym's nemo.gym.* attributes;
- on every server app, a middleware with the shape of
  FastAPIInstrumentor.instrument_app (the contrib instrumentation is not
  packaged by Debian, so it is written here to its shape): outermost, a
  SERVER span "<METHOD> <route template>" that adopts an inbound
  traceparent, old-convention http.* attributes, an INTERNAL child
  "<name> http receive" / "<name> http send" per ASGI receive/send message,
  and the metrics http.server.duration (ms), http.server.active_requests,
  http.server.request.size and http.server.response.size;
- server_utils.request's CLIENT span "HTTP <METHOD>" around every outbound
  call (http.request.method, url.full, http.response.status_code,
  nemo.gym.rollout.id), which injects traceparent into the request;
- the gym.* spans (gym.rollout on the agent's /run, gym.agent.responses on
  its /v1/responses routes, gym.model.* on the model routes, gym.verify on
  resources /verify) and the metrics gym.rollout.duration_ms,
  gym.verify.duration_ms and gym.verify.success_rate;
- every site behind its span group, a frozenset membership test, with Gym's
  presets (default = job, server, http_client, rollout; per_rollout =
  server, http_client, rollout, verify, agent, model_call).

Exporters (--gym-telemetry): otlp, the OTLP http/protobuf exporters to
--gym-telemetry-endpoint (/v1/traces, /v1/metrics; Debian's grpcio is too old
for the gRPC one); noop, exporters whose export does nothing and succeeds, so
spans and points are made, batched and collected but sending them is free (a
lower bound of Gym's cost); file, JSON lines in --gym-telemetry-out DIR, for
the self-tests. Every exporter is counted; POST /_gymtel/flush (answered
before any other middleware, so it is neither traced nor in the truth) flushes
the span processor and answers the counts.

Only imported when a server runs with --gym-telemetry: the default stack
never imports opentelemetry.
"""

import asyncio
import functools
import json
import os
import socket
import threading
import urllib.parse
from timeit import default_timer

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (MetricExporter, MetricExportResult,
                                                  PeriodicExportingMetricReader)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # pragma: no cover - depends on the interpreter
    raise SystemExit(
        f"--gym-telemetry needs the OpenTelemetry Python SDK ({e}): Debian packages "
        "python3-opentelemetry-sdk and python3-opentelemetry-exporter-otlp-proto-http "
        "(Debian sid has them: test/python/make-root.sh sid)")

from starlette.routing import Match, Route

# --------------------------------------------------------------------------
# Span groups, as Gym declares them into nemo-lens.

GROUPS = ("job", "server", "http_client", "rollout", "agent", "model_call", "verify", "sandbox")
INHERITED = ("checkpoint", "step", "optimizer")  # nemo-lens's training groups: nothing in Gym emits them
PRESETS = {
    "default": frozenset({"job", "server", "http_client", "rollout"}),
    "per_rollout": frozenset({"server", "http_client", "rollout", "verify", "agent", "model_call"}),
    "all": frozenset(GROUPS + INHERITED),
}


def resolve_groups(spec):
    """nemo-lens's resolver: comma-separated, stripped, lower-cased; presets
    and groups united; empty parts skipped; an unknown name is an error that
    lists every valid name."""
    out = set()
    for part in (spec or "").split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name in PRESETS:
            out |= PRESETS[name]
        elif name in GROUPS or name in INHERITED:
            out.add(name)
        else:
            valid = ", ".join(sorted(set(GROUPS) | set(INHERITED) | set(PRESETS)))
            raise ValueError(f"unknown span group {part.strip()!r} in {spec!r}; valid groups and presets: {valid}")
    return frozenset(out)


# The gym.* spans: (server kind, route template) -> (group, span name).
GYM_ROUTE_SPANS = {
    ("agent", "/run"): ("rollout", "gym.rollout"),
    ("agent", "/v1/responses"): ("agent", "gym.agent.responses"),
    ("agent", "/ng-rollout/{rollout_id}/v1/responses"): ("agent", "gym.agent.responses"),
    ("agent", "/ng-rollout/{rollout_id}/training-token-capture/v1/responses"): ("agent", "gym.agent.responses"),
    ("model", "/v1/responses"): ("model_call", "gym.model.responses"),
    ("model", "/v1/chat/completions"): ("model_call", "gym.model.chat_completions"),
    ("model", "/v1/messages"): ("model_call", "gym.model.messages"),
    ("resources", "/verify"): ("verify", "gym.verify"),
}

FLUSH_PATH = "/_gymtel/flush"

# Batch and reader settings of Gym's setup.
BSP_QUEUE, BSP_BATCH, BSP_DELAY_MS = 2048, 512, 5000
METRIC_INTERVAL_MS = 10000


# --------------------------------------------------------------------------
# Exporters.


class NoopSpanExporter(SpanExporter):
    """Export succeeds and does nothing: the spans were made and batched."""

    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


class NoopMetricExporter(MetricExporter):
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def _hex(n, width):
    return f"{n:0{width}x}" if n else ""


class JsonlSpanExporter(SpanExporter):
    """file mode (self-tests): one JSON object per span, one write per batch."""

    def __init__(self, path):
        self.path = path

    def export(self, spans):
        lines = []
        for s in spans:
            lines.append(json.dumps({
                "name": s.name, "kind": s.kind.name, "trace_id": _hex(s.context.trace_id, 32),
                "span_id": _hex(s.context.span_id, 16), "parent_span_id": _hex(s.parent.span_id, 16) if s.parent else "",
                "parent_remote": bool(s.parent and s.parent.is_remote),
                "start": s.start_time, "end": s.end_time, "status": s.status.status_code.name,
                "attributes": dict(s.attributes or {}), "resource": dict(s.resource.attributes),
                "scope": s.instrumentation_scope.name if s.instrumentation_scope else "",
            }, default=str))
        with open(self.path, "a") as f:
            f.write("".join(x + "\n" for x in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


class JsonlMetricExporter(MetricExporter):
    """file mode (self-tests): one JSON line per metric per export."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.exports = 0

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exports += 1
        lines = []
        for rm in metrics_data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    points = []
                    for p in m.data.data_points:
                        pt = {"attributes": dict(p.attributes or {})}
                        for k in ("value", "count", "sum"):
                            if hasattr(p, k):
                                pt[k] = getattr(p, k)
                        points.append(pt)
                    lines.append(json.dumps({"export": self.exports, "name": m.name, "unit": m.unit,
                                             "type": type(m.data).__name__, "points": points,
                                             "service": rm.resource.attributes.get("service.name")}, default=str))
        with open(self.path, "a") as f:
            f.write("".join(x + "\n" for x in lines))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


class Counts:
    """What was made and exported, for the flush endpoint (the bench checks
    that no export failed and reports the spans per rollout)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.spans_started = 0
        self.spans_ended = 0
        self.spans_exported = 0
        self.spans_failed = 0
        self.span_exports = 0
        self.metric_exports = 0
        self.metric_exports_failed = 0

    def snapshot(self):
        with self.lock:
            d = {k: v for k, v in vars(self).items() if k != "lock"}
        # Ended spans that never reached an exporter: the batch queue was full.
        d["spans_dropped"] = max(0, d["spans_ended"] - d["spans_exported"] - d["spans_failed"])
        return d


class CountingSpanExporter(SpanExporter):
    def __init__(self, inner, counts):
        self.inner = inner
        self.counts = counts

    def export(self, spans):
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        with self.counts.lock:
            self.counts.span_exports += 1
            if result == SpanExportResult.SUCCESS:
                self.counts.spans_exported += len(spans)
            else:
                self.counts.spans_failed += len(spans)
        return result

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.inner.force_flush(timeout_millis)


class CountingMetricExporter(MetricExporter):
    def __init__(self, inner, counts):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner = inner
        self.counts = counts

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            result = MetricExportResult.FAILURE
        with self.counts.lock:
            self.counts.metric_exports += 1
            if result != MetricExportResult.SUCCESS:
                self.counts.metric_exports_failed += 1
        return result

    def force_flush(self, timeout_millis=10_000):
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis=30_000, **kwargs):
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class OpenSpanCloser(SpanProcessor):
    """nemo-lens's closer: remembers every open span, and at shutdown ends
    the ones still open with nemo.span.truncated=true (before the batch
    processor shuts down, so they are exported)."""

    def __init__(self, counts):
        self.counts = counts
        self.lock = threading.Lock()
        self.open = {}

    def on_start(self, span, parent_context=None):
        with self.lock:
            self.open[span.context.span_id] = span
        self.counts.spans_started += 1

    def on_end(self, span):
        with self.lock:
            self.open.pop(span.context.span_id, None)
        self.counts.spans_ended += 1

    def shutdown(self):
        with self.lock:
            left = list(self.open.values())
            self.open.clear()
        for span in left:
            span.set_attribute("nemo.span.truncated", True)
            span.end()

    def force_flush(self, timeout_millis=30000):
        return True


# --------------------------------------------------------------------------
# The FastAPI instrumentation's shape.


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


class GymRouteSpan:
    """A gym.* span around one route's handler function (as Gym's decorator
    wraps it: the body is read inside, the response written after), behind
    its group."""

    def __init__(self, handler, tel, group, name):
        self.handler = handler
        self.tel = tel
        self.group = group
        self.name = name
        self.server = tel.server_name
        functools.update_wrapper(self, handler)

    async def __call__(self, *args, **kwargs):
        tel = self.tel
        if self.group not in tel.groups:
            return await self.handler(*args, **kwargs)
        t0 = default_timer()
        ok = False
        with tel.tracer.start_as_current_span(self.name, attributes={"nemo.gym.server.name": self.server}) as span:
            try:
                result = await self.handler(*args, **kwargs)
                ok = True
                return result
            finally:
                request = kwargs.get("request")
                scope = request.scope if request is not None else {}
                rollout_id = scope.get("gt_rollout_id") or kwargs.get("rollout_id")
                if rollout_id and span.is_recording():
                    span.set_attribute("nemo.gym.rollout.id", rollout_id)
                tel.record_gym(self.group, (default_timer() - t0) * 1000, ok)


class Control:
    """Outermost: the bench's flush endpoint, answered before anything else."""

    def __init__(self, app, tel):
        self.app = app
        self.tel = tel

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == FLUSH_PATH:
            ok = await asyncio.get_running_loop().run_in_executor(None, self.tel.flush)
            body = json.dumps(dict(self.tel.counts.snapshot(), flushed=ok, pid=os.getpid())).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------
# The process's telemetry.


class GymTelemetry:
    def __init__(self, mode, server_name, server_type, kind, groups, endpoint=None, out_dir=None):
        self.mode = mode
        self.server_name = server_name
        self.kind = kind
        self.groups = groups
        self.counts = Counts()
        resource = Resource.create({
            "service.name": f"nemo-gym/{server_name}",
            "nemo.gym.server.name": server_name,
            "nemo.gym.server.type": server_type,
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
        })
        if mode == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            base = endpoint.rstrip("/")
            span_exporter = OTLPSpanExporter(endpoint=base + "/v1/traces")
            metric_exporter = OTLPMetricExporter(endpoint=base + "/v1/metrics")
        elif mode == "noop":
            span_exporter, metric_exporter = NoopSpanExporter(), NoopMetricExporter()
        elif mode == "file":
            os.makedirs(out_dir, exist_ok=True)
            span_exporter = JsonlSpanExporter(os.path.join(out_dir, f"{server_name}.spans.jsonl"))
            metric_exporter = JsonlMetricExporter(os.path.join(out_dir, f"{server_name}.metrics.jsonl"))
        else:
            raise ValueError(f"--gym-telemetry {mode!r}: want otlp, noop or file")
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(OpenSpanCloser(self.counts))
        self.batch = BatchSpanProcessor(CountingSpanExporter(span_exporter, self.counts), max_queue_size=BSP_QUEUE,
                                        max_export_batch_size=BSP_BATCH, schedule_delay_millis=BSP_DELAY_MS)
        self.tracer_provider.add_span_processor(self.batch)
        reader = PeriodicExportingMetricReader(CountingMetricExporter(metric_exporter, self.counts),
                                               export_interval_millis=METRIC_INTERVAL_MS)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        trace.set_tracer_provider(self.tracer_provider)
        from opentelemetry import metrics
        metrics.set_meter_provider(self.meter_provider)
        propagate.set_global_textmap(CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()]))
        self.tracer = self.tracer_provider.get_tracer("nemo_gym")
        meter = self.meter_provider.get_meter("nemo_gym")
        self.rollout_duration = meter.create_histogram("gym.rollout.duration_ms", unit="ms",
                                                       description="Duration of one rollout (agent /run).")
        self.verify_duration = meter.create_histogram("gym.verify.duration_ms", unit="ms",
                                                      description="Duration of one /verify call.")
        self.verify_success = meter.create_gauge("gym.verify.success_rate", unit="1",
                                                 description="Fraction of /verify calls that did not raise.")
        self.verify_calls = self.verify_ok = 0

    def record_gym(self, group, ms, ok):
        if group == "rollout":
            self.rollout_duration.record(ms)
        elif group == "verify":
            self.verify_duration.record(ms)
            self.verify_calls += 1
            self.verify_ok += ok
            self.verify_success.set(self.verify_ok / self.verify_calls)

    def install(self, app, client):
        """Instrument one server app (call after its routes exist) and its client."""
        # FastAPI from 0.16x has telemetry of its own, on as soon as a global
        # provider is set: its own SERVER spans (stable conventions) and
        # operation spans. Gym's FastAPI (0.135) has none, so it stays off.
        native = getattr(app, "_telemetry", None)
        if isinstance(native, dict):
            native.update(tracing=False, metrics=False, logs=False, operation_spans=False)
        for r in app.routes:
            site = GYM_ROUTE_SPANS.get((self.kind, getattr(r, "path", None)))
            dependant = getattr(r, "dependant", None)
            if site:
                # FastAPI calls the handler through route.dependant.call.
                dependant.call = GymRouteSpan(dependant.call, self, *site)
        server_on = "server" in self.groups
        original = app.build_middleware_stack

        def build_middleware_stack():
            stack = original()
            if server_on:
                stack = ServerSpans(stack, self)
            return Control(stack, self)

        app.build_middleware_stack = build_middleware_stack
        client.telemetry = self
        # At lifespan shutdown (uvicorn re-raises SIGTERM once it has shut
        # down, so nothing after its run() would run): the closer ends what
        # is still open, then both providers flush.
        app.router.add_event_handler("shutdown", self.shutdown)

    async def client_request(self, client, method, url, **kw):
        """server_utils.request: the CLIENT span, which writes traceparent.
        With http_client off nothing is injected (the span writes it)."""
        headers = {}
        if "http_client" not in self.groups:
            return await client.request(method, url, headers=headers, **kw)
        attrs = {"http.request.method": method, "url.full": url.split("?", 1)[0]}
        if kw.get("rollout_id"):
            attrs["nemo.gym.rollout.id"] = kw["rollout_id"]
        with self.tracer.start_as_current_span(f"HTTP {method}", kind=SpanKind.CLIENT, attributes=attrs) as span:
            propagate.inject(headers)
            reply = await client.request(method, url, headers=headers, **kw)
            if span.is_recording():
                span.set_attribute("http.response.status_code", reply.status)
            return reply

    def flush(self):
        return self.tracer_provider.force_flush(10000)

    def shutdown(self):
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def setup(app, cfg, kind, client, args):
    """--gym-telemetry: set up this server process's telemetry and instrument its app."""
    try:
        groups = resolve_groups(args.gym_span_groups)
    except ValueError as e:
        raise SystemExit(f"--gym-span-groups: {e}")
    if args.gym_telemetry == "otlp" and not args.gym_telemetry_endpoint:
        raise SystemExit("--gym-telemetry otlp needs --gym-telemetry-endpoint http://HOST:PORT (OTLP http/protobuf)")
    if args.gym_telemetry == "file" and not args.gym_telemetry_out:
        raise SystemExit("--gym-telemetry file needs --gym-telemetry-out DIR")
    tel = GymTelemetry(args.gym_telemetry, cfg.name, cfg.type, kind, groups,
                       endpoint=args.gym_telemetry_endpoint, out_dir=args.gym_telemetry_out)
    tel.install(app, client)
    return tel
