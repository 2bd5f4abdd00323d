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

The exporters, their counts and the open-span closer are in gymtel_exporters.py,
the FastAPI instrumentation's shape (ServerSpans) in gymtel_fastapi.py; both are
imported only from here.
"""

import asyncio
import functools
import json
import os
import socket
from timeit import default_timer

try:
    from opentelemetry import propagate, trace
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as e:  # pragma: no cover - depends on the interpreter
    raise SystemExit(
        f"--gym-telemetry needs the OpenTelemetry Python SDK ({e}): Debian packages "
        "python3-opentelemetry-sdk and python3-opentelemetry-exporter-otlp-proto-http "
        "(Debian sid has them: test/python/make-root.sh sid)")

# After the check above: these import the SDK (and starlette) too.
from gymtel_exporters import (CountingMetricExporter, CountingSpanExporter, Counts,
                              JsonlMetricExporter, JsonlSpanExporter, NoopMetricExporter,
                              NoopSpanExporter, OpenSpanCloser)
from gymtel_fastapi import ServerSpans

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
