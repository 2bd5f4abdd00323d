"""Self-tests of Gym's own telemetry in the stack (gymtel.py, --gym-telemetry),
on the Debian sid root; skipped where that root or root rights are missing.

    /usr/bin/python3 -m unittest discover -s test/stack -p 'test_*.py' -v
"""

import collections
import json
import os
import signal
import subprocess
import tempfile
import unittest

from test_stack import HANG, HERE, LAUNCH, PY, http  # also puts HERE on sys.path

import truthcheck


# --------------------------------------------------------------------------
# Gym's own telemetry (gymtel.py), on the Debian sid root's Python 3.14, the
# one root that packages the OTel Python SDK.

SID_ROOT = os.environ.get("GYMTRACE_SID_ROOT", "/var/tmp/gymtrace-sid")
SID_PY = "/usr/bin/python3.14"
OTEL_PACKAGES = "python3-opentelemetry-sdk and python3-opentelemetry-exporter-otlp-proto-http"


def sid_missing():
    """Why the gymtel tests cannot run here, "" when they can."""
    if os.geteuid() != 0:
        return "needs root (chroot into the Debian sid root)"
    if not os.path.exists(SID_ROOT + SID_PY):
        return (f"no Debian sid root with python3.14 at {SID_ROOT}: run test/python/make-root.sh sid as root "
                f"(scripts/setup --tests does); it installs {OTEL_PACKAGES}")
    r = subprocess.run(["chroot", SID_ROOT, SID_PY, "-c",
                        "import fastapi, uvicorn, aiohttp, yaml, uvloop, httptools, opentelemetry.sdk.trace, "
                        "opentelemetry.exporter.otlp.proto.http.trace_exporter"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return (f"the Debian sid root at {SID_ROOT} lacks the OTel SDK or the web stack "
                f"({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}): install the Debian packages "
                f"{OTEL_PACKAGES} into it (rm -rf {SID_ROOT} && test/python/make-root.sh sid)")
    return ""


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def flush(url):
    st, _, raw = http("POST", url + "/_gymtel/flush", timeout=30)
    assert st == 200, (st, raw)
    return json.loads(raw)


class GymTelemetryTest(unittest.TestCase):
    """--gym-telemetry: Gym's in-process OpenTelemetry set up in the servers."""

    @classmethod
    def setUpClass(cls):
        why = sid_missing()
        if why:
            raise unittest.SkipTest(f"Gym telemetry tests skipped: {why}")
        cls.host = tempfile.mkdtemp(prefix="gymtel-test-", dir=os.path.join(SID_ROOT, "tmp"))
        cls.inside = "/" + os.path.relpath(cls.host, SID_ROOT)
        subprocess.run(["cp", "-r", HERE, os.path.join(cls.host, "stack")], check=True)
        subprocess.run(["rm", "-rf", os.path.join(cls.host, "stack", "__pycache__")], check=True)

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["rm", "-rf", cls.host])

    def sid_args(self, name):
        """launch.py options for the sid root (uvloop + httptools, as Gym), and
        a directory both sides see: (args, host dir, inside dir)."""
        d = os.path.join(self.host, name)
        os.makedirs(d)
        inside = os.path.join(self.inside, name)
        return (["--python", f"chroot {SID_ROOT} {SID_PY}", "--stack-dir", os.path.join(self.inside, "stack"),
                 "--loop", "uvloop", "--http", "httptools", "--log-dir", os.path.join(d, "logs")], d, inside)

    def serve(self, *args):
        r = subprocess.Popen([PY, LAUNCH, "--serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = json.loads(r.stdout.readline())

        def stop():
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=HANG)
            return [json.loads(x) for x in out.splitlines() if x.strip()]
        if ready.get("event") != "ready":
            stop()
            self.fail(f"the stack did not start: {ready}")
        return ready, stop

    def collect(self, ready, n, *extra):
        c = subprocess.run(ready["collector_argv"] + ["--rollouts", str(n), "--concurrency", "2", *extra],
                           capture_output=True, text=True, timeout=HANG)
        self.assertEqual(c.returncode, 0, c.stderr[-2000:])
        return json.loads(c.stdout.splitlines()[-1])

    def test_per_rollout_spans_join_across_servers(self):
        args, d, inside = self.sid_args("per_rollout")
        truth = os.path.join(inside, "truth.jsonl")
        r = subprocess.run([PY, LAUNCH, *args, "--gym-telemetry", "file", "--gym-telemetry-out", os.path.join(inside, "tel"),
                            "--gym-span-groups", "per_rollout", "--truth", truth, "--rollouts", "4", "--concurrency", "2"],
                           capture_output=True, text=True, timeout=HANG)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        ev = {json.loads(x)["event"]: json.loads(x) for x in r.stdout.splitlines()}
        self.assertEqual(ev["summary"]["ok"], 4)
        self.assertEqual(ev["ready"]["gym_telemetry"]["exporter"], "file")
        self.assertTrue(truthcheck.check(os.path.join(d, "truth.jsonl"))["ok"], "telemetry broke the ground truth")
        tel = os.path.join(d, "tel")
        spans = []
        for name in ("simple_weather_simple_agent", "policy_model", "simple_weather"):
            got = read_jsonl(os.path.join(tel, f"{name}.spans.jsonl"))
            self.assertTrue(got)
            self.assertEqual({s["resource"]["service.name"] for s in got}, {f"nemo-gym/{name}"})
            spans += got
        by_id = {s["span_id"]: s for s in spans}
        traces = collections.defaultdict(list)
        for s in spans:
            traces[s["trace_id"]].append(s)
        rollouts = [t for t in traces.values() if any(s["name"] == "POST /run" for s in t)]
        self.assertEqual(len(rollouts), 4, "one trace per rollout")
        want = collections.Counter({
            ("SERVER", "POST /run"): 1, ("SERVER", "POST /seed_session"): 1, ("SERVER", "POST /v1/responses"): 3,
            ("SERVER", "POST /get_weather"): 3, ("SERVER", "POST /verify"): 1, ("CLIENT", "HTTP POST"): 8,
            ("INTERNAL", "gym.rollout"): 1, ("INTERNAL", "gym.agent.responses"): 1, ("INTERNAL", "gym.model.responses"): 2,
            ("INTERNAL", "gym.verify"): 1})
        for t in rollouts:
            got = collections.Counter((s["kind"], s["name"]) for s in t if not s["name"].endswith((" http receive", " http send")))
            self.assertEqual(got, want)
            roots = [s for s in t if not s["parent_span_id"]]
            self.assertEqual([s["name"] for s in roots], ["POST /run"])  # the collector has no telemetry
            for s in t:
                if s["parent_span_id"]:
                    self.assertIn(s["parent_span_id"], by_id, f"{s['name']}: parent not exported")
                    self.assertEqual(by_id[s["parent_span_id"]]["trace_id"], s["trace_id"])
                parent = by_id.get(s["parent_span_id"])
                if s["kind"] == "SERVER" and parent:
                    # traceparent joined the trace across processes
                    self.assertEqual(parent["kind"], "CLIENT", s["name"])
                    self.assertTrue(s["parent_remote"])
                    self.assertEqual(s["attributes"]["http.status_code"], 200)
                    self.assertEqual(parent["attributes"]["http.response.status_code"], 200)
                    self.assertTrue(parent["attributes"]["url.full"].endswith(s["attributes"]["http.route"]))
                if s["kind"] == "SERVER":
                    a = s["attributes"]
                    self.assertEqual((a["http.method"], a["http.scheme"], a["http.flavor"]), ("POST", "http", "1.1"))
                    self.assertEqual(s["name"], "POST " + a["http.route"])
                    self.assertIn("net.host.port", a)
                    kids = [k for k in t if k["parent_span_id"] == s["span_id"] or
                            (by_id.get(k["parent_span_id"], {}).get("parent_span_id") == s["span_id"]
                             and by_id[k["parent_span_id"]]["name"].startswith("gym."))]
                    self.assertGreaterEqual(sum(k["name"] == s["name"] + " http receive" for k in kids), 1, s["name"])
                    self.assertGreaterEqual(sum(k["name"] == s["name"] + " http send" for k in kids), 2, s["name"])
                if s["kind"] == "CLIENT":
                    self.assertIn(parent["name"], {"gym.rollout", "gym.agent.responses"})
                    self.assertEqual(s["attributes"]["http.request.method"], "POST")
                    self.assertTrue(s["attributes"]["nemo.gym.rollout.id"])
                if s["name"].startswith("gym."):
                    self.assertEqual(parent["kind"], "SERVER")
        # Metrics: the last (cumulative) export of each server, at shutdown.
        def last(name):
            ms = read_jsonl(os.path.join(tel, f"{name}.metrics.jsonl"))
            top = max(m["export"] for m in ms)
            return {m["name"]: m for m in ms if m["export"] == top}
        agent, res, model = last("simple_weather_simple_agent"), last("simple_weather"), last("policy_model")
        self.assertEqual(agent["gym.rollout.duration_ms"]["points"][0]["count"], 4)
        self.assertEqual(res["gym.verify.duration_ms"]["points"][0]["count"], 4)
        self.assertEqual(res["gym.verify.success_rate"]["points"][0]["value"], 1.0)
        for m in (agent, res, model):
            for k in ("http.server.duration", "http.server.active_requests", "http.server.request.size", "http.server.response.size"):
                self.assertIn(k, m)
            self.assertEqual(m["http.server.duration"]["unit"], "ms")
        targets = {p["attributes"].get("http.target"): p["count"] for p in res["http.server.duration"]["points"]}
        self.assertEqual((targets["/get_weather"], targets["/verify"], targets["/seed_session"]), (12, 4, 4))
        p = next(p for p in model["http.server.duration"]["points"] if p["attributes"].get("http.target") == "/v1/responses")
        self.assertEqual(p["count"], 8)
        self.assertEqual(set(p["attributes"]) - {"net.host.name"}, {"http.method", "http.host", "http.scheme", "http.status_code",
                                                                    "http.flavor", "http.server_name", "net.host.port", "http.target"})

    def test_default_groups_and_flush_counts(self):
        args, d, inside = self.sid_args("default")
        ready, stop = self.serve(*args, "--gym-telemetry", "file", "--gym-telemetry-out", os.path.join(inside, "tel"))
        try:
            urls = {k: s["url"] for k, s in ready["servers"].items()}
            before = {k: flush(u) for k, u in urls.items()}
            self.collect(ready, 3)
            after = {k: flush(u) for k, u in urls.items()}
        finally:
            events = stop()
        made = {k: after[k]["spans_exported"] - before[k]["spans_exported"] for k in urls}
        # Per rollout, default groups: the agent's 2 SERVER spans with 1 receive and 2 (/run) or 3
        # (/v1/responses, behind a BaseHTTPMiddleware) sends, gym.rollout, 8 CLIENT spans; model
        # 2 and resources 5 SERVER spans with 1 receive and 2 sends each.
        self.assertEqual(made, {"agent": 3 * 18, "model": 3 * 8, "resources": 3 * 20}, (before, after))
        for k in urls:
            self.assertEqual((after[k]["spans_failed"], after[k]["spans_dropped"]), (0, 0))
            self.assertTrue(after[k]["flushed"])
        self.assertEqual(events[-1]["event"], "stopped")
        names = {s["name"] for f in os.listdir(os.path.join(d, "tel")) if f.endswith(".spans.jsonl")
                 for s in read_jsonl(os.path.join(d, "tel", f))}
        self.assertIn("gym.rollout", names)
        self.assertFalse({n for n in names if n.startswith("gym.") and n != "gym.rollout"}, names)
        self.assertNotIn("/_gymtel/flush", " ".join(names))  # the flush endpoint is not traced
        metrics = {m["name"] for m in read_jsonl(os.path.join(d, "tel", "simple_weather.metrics.jsonl"))}
        self.assertFalse({m for m in metrics if m.startswith("gym.verify")}, "verify is off in default")

    def test_http_client_off_injects_nothing(self):
        args, d, inside = self.sid_args("server_only")
        r = subprocess.run([PY, LAUNCH, *args, "--gym-telemetry", "file", "--gym-telemetry-out", os.path.join(inside, "tel"),
                            "--gym-span-groups", "server", "--rollouts", "2"], capture_output=True, text=True, timeout=HANG)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        spans = [s for f in os.listdir(os.path.join(d, "tel")) if f.endswith(".spans.jsonl")
                 for s in read_jsonl(os.path.join(d, "tel", f))]
        servers = [s for s in spans if s["kind"] == "SERVER"]
        self.assertGreater(len(servers), 18)
        self.assertFalse([s for s in spans if s["kind"] == "CLIENT" or s["name"].startswith("gym.")])
        self.assertFalse([s["name"] for s in servers if s["parent_span_id"]], "a traceparent was injected without http_client")

    def test_noop_and_otlp_exporters(self):
        import http.server
        import threading
        posts = []

        class Receiver(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.append((self.path, self.headers["Content-Type"], len(body)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        for mode in ("noop", "otlp"):
            args, d, inside = self.sid_args(mode)
            extra = ["--gym-telemetry-endpoint", f"http://127.0.0.1:{srv.server_address[1]}"] if mode == "otlp" else []
            ready, stop = self.serve(*args, "--gym-telemetry", mode, "--gym-span-groups", "per_rollout", *extra)
            try:
                self.assertEqual(ready["gym_telemetry"]["exporter"], mode)
                urls = {k: s["url"] for k, s in ready["servers"].items()}
                before = {k: flush(u) for k, u in urls.items()}
                self.collect(ready, 2)
                after = {k: flush(u) for k, u in urls.items()}
            finally:
                stop()
            made = {k: after[k]["spans_exported"] - before[k]["spans_exported"] for k in urls}
            # per_rollout adds gym.agent.responses, 2 gym.model.responses and gym.verify to default's 46.
            self.assertEqual(made, {"agent": 2 * 19, "model": 2 * 10, "resources": 2 * 21}, mode)
            self.assertTrue(all(a["spans_failed"] == 0 and a["metric_exports_failed"] == 0 for a in after.values()), after)
        traces = [p for p in posts if p[0] == "/v1/traces"]
        self.assertTrue(traces and all(ct == "application/x-protobuf" and n > 0 for _, ct, n in traces), posts)
        self.assertTrue(any(p[0] == "/v1/metrics" for p in posts), "no metrics export (at shutdown at the latest)")

    def test_span_group_resolver(self):
        code = "\n".join([
            f"import sys; sys.path.insert(0, {os.path.join(self.inside, 'stack')!r})",
            "import gymtel as g",
            "r = g.resolve_groups",
            "assert r('default') == {'job', 'server', 'http_client', 'rollout'}",
            "assert r(' Per_Rollout , ,sandbox') == g.PRESETS['per_rollout'] | {'sandbox'}",
            "assert r('') == frozenset() and 'checkpoint' in r('all')",
            "try:",
            "    r('server,bogus')",
            "except ValueError as e:",
            "    print(e)",
        ])
        out = subprocess.run(["chroot", SID_ROOT, SID_PY, "-c", code], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("'bogus'", out.stdout)
        self.assertIn("agent, all, checkpoint, default, http_client, job, model_call, optimizer, per_rollout, rollout, "
                      "sandbox, server, step, verify", out.stdout)


if __name__ == "__main__":
    unittest.main()
