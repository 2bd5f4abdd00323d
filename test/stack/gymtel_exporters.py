"""Gym's own telemetry (gymtel.py): its exporters, the counts the flush
endpoint answers, and nemo-lens's open-span closer. Imported only by gymtel.py,
after its check that the OpenTelemetry SDK is there.
"""

import json
import threading

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


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
