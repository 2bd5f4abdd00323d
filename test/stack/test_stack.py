"""Self-tests of the Gym-shaped stack (no tracer involved).

    /usr/bin/python3 -m unittest discover -s test/stack -p 'test_*.py' -v
"""

import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)

import stacklib  # noqa: E402
import truthcheck  # noqa: E402

PY = "/usr/bin/python3"
LAUNCH = os.path.join(HERE, "launch.py")
NG_RUN = os.path.join(HERE, "bin", "ng_run")


def launch(*args, timeout=120):
    r = subprocess.run([PY, LAUNCH, *args], capture_output=True, text=True, timeout=timeout)
    events = {}
    for line in r.stdout.splitlines():
        obj = json.loads(line)  # stdout must be JSON lines only
        events[obj["event"]] = obj
    return r, events


class RolloutIdTest(unittest.TestCase):
    def test_gym_rollout_id(self):
        self.assertEqual(stacklib.gym_rollout_id({"_ng_task_index": 3, "_ng_rollout_index": 1}), "3-1")
        self.assertEqual(stacklib.gym_rollout_id({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2}), "3-1-a2")
        self.assertEqual(stacklib.gym_rollout_id({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_rollout_id": "x"}), "x")
        self.assertIsNone(stacklib.gym_rollout_id({}))


class StackTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gymstack-test-")
        self.truth = os.path.join(self.tmp, "truth.jsonl")

    def run_ok(self, *args, rollouts=8, concurrency=4, collector=()):
        r, ev = launch("--rollouts", str(rollouts), "--concurrency", str(concurrency), "--truth", self.truth,
                       "--check-truth", "--log-dir", self.tmp, *args, "--", *collector)
        self.assertEqual(r.returncode, 0, f"launcher failed:\nstdout={r.stdout}\nstderr={r.stderr[-3000:]}")
        self.assertEqual(ev["summary"]["ok"], rollouts, ev["summary"])
        self.assertEqual(ev["summary"]["reward_mean"], 1.0, "cookies were not forwarded on every hop")
        self.assertTrue(ev["truth_check"]["ok"], ev["truth_check"])
        self.assertEqual(ev["truth_check"]["runs"], rollouts)
        self.assertEqual(set(ev["stopped"]["exit_codes"].values()), {0})
        return ev

    def test_default(self):
        ev = self.run_ok()
        ready = ev["ready"]
        self.assertEqual(set(ready["servers"]), {"agent", "model", "resources"})
        self.assertEqual(ready["servers"]["agent"]["type"], "responses_api_agents")
        self.assertEqual(ev["summary"]["rollout_ids"], [f"{i}-0" for i in range(8)])

    def test_httptools_uvloop_streaming_prefix_sandbox(self):
        self.run_ok("--http", "httptools", "--loop", "uvloop", "--fakebin", rollouts=12, concurrency=6,
                    collector=["--stream", "--model-route", "mixed", "--prefix", "mixed", "--sandbox", "docker",
                               "--sandbox-rc", "3", "--verify-sandbox", "apptainer"])
        recs = truthcheck.load(self.truth)
        spawns = [r for r in recs if r["ev"] == "spawn"]
        self.assertEqual(len(spawns), 12 * 4)  # start + 2 turns of exec + verify exec
        self.assertEqual({r["return_code"] for r in spawns if r["provider"] == "docker" and r["verb"] == "exec"}, {3})
        ins = {r["id"]: r for r in recs if r["ev"] == "in"}
        self.assertEqual({ins[r["cause"]]["route"] for r in spawns}, {"/run_sandbox", "/verify"})
        prefixed = [r for r in recs if r["ev"] == "in" and r["path"].startswith("/ng-rollout/")]
        self.assertTrue(prefixed and all(r["rollout_id"] for r in prefixed))

    def test_ipv6(self):
        ev = self.run_ok("--host", "::1", rollouts=4)
        self.assertEqual(ev["ready"]["servers"]["model"]["url"].split(":")[0:2], ["http", "//["])

    def test_shell_mode_like_gym(self):
        r = subprocess.Popen([PY, LAUNCH, "--serve", "--shell", "--log-dir", self.tmp], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            ready = json.loads(r.stdout.readline())
            self.assertEqual(ready["event"], "ready", ready)
            for kind, s in ready["servers"].items():
                with open(f"/proc/{s['pid']}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                self.assertEqual(env[b"NEMO_GYM_CONFIG_PATH"].decode(), s["name"])
                self.assertIn(s["name"].encode() + b":", env[b"NEMO_GYM_CONFIG_DICT"])
                with open(f"/proc/{s['pid']}/cmdline", "rb") as f:
                    self.assertIn(f"{kind}.py".encode(), f.read())
        finally:
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=30)
        self.assertEqual(r.returncode, 0, err)
        self.assertEqual(json.loads(out.splitlines()[-1])["event"], "stopped")

    def test_serve_keeps_pooled_connections_and_stops_on_sigterm(self):
        r = subprocess.Popen([PY, LAUNCH, "--serve", "--warmup", "4", "--log-dir", self.tmp], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            ready = json.loads(r.stdout.readline())
            self.assertEqual(ready["warmup"]["ok"], 4, ready)
            agent = ready["servers"]["agent"]["pid"]
            # The agent's pooled keep-alive sockets outlive the warmup collector.
            socks = [fd for fd in os.listdir(f"/proc/{agent}/fd")
                     if os.readlink(f"/proc/{agent}/fd/{fd}").startswith("socket:")]
            self.assertGreater(len(socks), 3)
            c = subprocess.run(ready["collector_argv"] + ["--rollouts", "3"], capture_output=True, text=True, timeout=60)
            self.assertEqual(c.returncode, 0, c.stderr)
            self.assertEqual(json.loads(c.stdout)["ok"], 3)
        finally:
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=30)
        self.assertEqual(r.returncode, 0, err)
        for s in ready["servers"].values():
            self.assertFalse(os.path.exists(f"/proc/{s['pid']}"), f"{s['name']} still running")

    def test_sandbox_refuses_system_cli(self):
        r, ev = launch("--rollouts", "1", "--log-dir", self.tmp, "--", "--sandbox", "docker")
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(ev["summary"]["failed"], 1)


def http(method, url, body=None, headers=None, timeout=10):
    """(status, headers, raw body) of one request; HTTP errors are answers too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


class ResourcesServer:
    """One resources.py started by hand (no Gym env), for its /verify alone."""

    def __init__(self, tmp, *flags):
        self.port = stacklib.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.truth = os.path.join(tmp, f"resources-{self.port}.jsonl")
        self.log = open(os.path.join(tmp, f"resources-{self.port}.log"), "wb")
        self.proc = subprocess.Popen([PY, os.path.join(HERE, "resources.py"), "--port", str(self.port),
                                      "--truth", self.truth, *flags], cwd=HERE, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if http("GET", self.url + "/", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"resources.py did not start; see {self.log.name}")
            time.sleep(0.05)

    def verify(self, body, seeded=True):
        """POST /verify, with a session seeded first (so the cookie check passes) when seeded."""
        headers = {}
        if seeded:
            st, h, _ = http("POST", self.url + "/seed_session", {"expected_tool_calls": 0})
            assert st == 200, st
            headers["Cookie"] = h["Set-Cookie"].split(";", 1)[0]
        return http("POST", self.url + "/verify", body, headers)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)
        self.log.close()
        return truthcheck.load(self.truth)


def last_key_value(raw):
    """The last top-level key of a JSON object and its value's text."""
    keys = list(json.loads(raw, object_pairs_hook=lambda kv: kv))
    m = re.search(rb'"reward":(-?[0-9][0-9.eE+-]*)}$', raw)
    return keys[-1][0], m.group(1).decode() if m else None


class VerifyOptionsTest(unittest.TestCase):
    """resources /verify: --rewards varied, --verify-pad, --verify-fail-rate."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gymstack-test-")

    def server(self, *flags):
        s = ResourcesServer(self.tmp, *flags)
        self.addCleanup(lambda: s.proc.poll() is None and s.stop())
        return s

    def test_default_answer_unchanged(self):
        s = self.server()
        st, h, raw = s.verify({"response": {"x": 1}})
        self.assertEqual((st, raw), (200, b'{"reward":1.0,"session_found":true,"tool_calls":0}'))
        st, h, raw = s.verify({"response": {}}, seeded=False)
        self.assertEqual(json.loads(raw)["reward"], 0.0)
        v = truthcheck.verify_ins(s.stop())
        self.assertEqual([(r["reward"], r["reward_text"], r["session_ok"]) for r in v], [(1.0, "1.0", True), (0.0, "0.0", False)])

    def test_varied_rewards_are_seeded_forms_and_reward_is_last(self):
        texts = []
        for _ in range(2):
            s = self.server("--rewards", "varied", "--reward-seed", "11")
            answers = [s.verify({"response": {"n": i}}) for i in range(12)]
            recs = truthcheck.verify_ins(s.stop())
            got = []
            for (st, h, raw), r in zip(answers, recs):
                self.assertEqual(st, 200, raw)
                self.assertEqual(h["Content-Type"], "application/json")
                key, text = last_key_value(raw)
                self.assertEqual(key, "reward", raw)
                self.assertEqual(text, r["reward_text"])  # the truth has the exact text on the wire
                self.assertEqual(float(text), r["reward"])
                self.assertEqual(json.loads(raw)["reward"], r["reward"])
                self.assertEqual(r["body_bytes"], len(raw))
                self.assertIsNone(truthcheck.bad_verify(r), r)
                got.append(text)
            # Two blocks: every form twice.
            self.assertEqual(collections.Counter(r["reward_form"] for r in recs),
                             {f: 2 for f in ("int", "neg_int", "frac", "exp", "EXP", "long")})
            texts.append(got)
        self.assertEqual(texts[0], texts[1], "same seed, different rewards")
        t = texts[0]
        self.assertTrue(any(re.fullmatch(r"-?[0-9.]+e-[0-9]+", x) for x in t), t)      # -1.5e-3
        self.assertTrue(any(re.fullmatch(r"-?[0-9]+E[+-][0-9]+", x) for x in t), t)    # 2E+2
        self.assertTrue(any(re.fullmatch(r"-[0-9]+", x) for x in t), t)                # -3
        self.assertTrue(any(re.fullmatch(r"-?[0-9]+\.[0-9]{6}", x) for x in t), t)    # 7.000001
        self.assertTrue(any(re.fullmatch(r"-?[0-9]+\.[0-9]{1,3}", x) for x in t), t)  # 0.125
        s = self.server("--rewards", "varied", "--reward-seed", "12")
        other = [last_key_value(s.verify({})[2])[1] for _ in range(12)]
        self.assertNotEqual(other, t, "another seed, same rewards")
        # A failed cookie check still answers 0.0.
        st, _, raw = s.verify({}, seeded=False)
        self.assertEqual(last_key_value(raw), ("reward", "0.0"))
        self.assertFalse(truthcheck.verify_ins(s.stop())[-1]["session_ok"])

    def test_pad_echoes_request_with_decoys(self):
        s = self.server("--rewards", "varied", "--reward-seed", "3", "--verify-pad", "40")
        req = {"response": {"object": "response", "turns": [{"tool": {"city": "Paris"}}]}, "verify_sandbox": None}
        st, _, raw = s.verify(req)
        self.assertEqual(st, 200)
        self.assertGreater(len(raw), 40 * 1024)
        self.assertEqual(len(raw), 40 * 1024 + 1)
        body = json.loads(raw)
        key, text = last_key_value(raw)
        self.assertEqual(key, "reward")
        self.assertEqual(body["reward"], float(text))
        echo = body["request"]
        self.assertEqual({k: echo[k] for k in req}, req)        # the request, echoed
        self.assertEqual(echo["reward"], 98765.4321)             # nested decoy
        self.assertEqual(echo["grader"]["reward"], -4242.5)      # deeper decoy
        self.assertIn('{"reward": 12345}', body["transcript"])  # decoy in a string...
        self.assertIn(b'{\\"reward\\": 12345}', raw)          # ...escaped on the wire
        self.assertEqual(body["reward_std"], 4321)
        self.assertEqual(raw.count(b'"reward":'), 3)             # 2 decoy keys, then the real one
        self.assertTrue(raw.endswith(f'"reward":{text}}}'.encode()), raw[-60:])
        rec = truthcheck.verify_ins(s.stop())[0]
        self.assertEqual((rec["reward_text"], rec["body_bytes"]), (text, len(raw)))
        # Binary rewards can be padded too.
        b = self.server("--verify-pad", "2")
        st, _, raw = b.verify({})
        self.assertEqual((st, last_key_value(raw)), (200, ("reward", "1.0")))
        self.assertGreater(len(raw), 2048)

    def test_fail_rate_answers_500(self):
        s = self.server("--verify-fail-rate", "1")
        st, h, raw = s.verify({})
        self.assertEqual((st, raw), (500, b"Internal Server Error"))
        self.assertEqual(h["Connection"], "close")
        self.assertEqual(s.proc.poll(), None, "a raising /verify must not stop the server")
        rec = truthcheck.verify_ins(s.stop())[0]
        self.assertEqual((rec["status"], rec["verify_outcome"], rec["reward"], rec["reward_text"]), (500, "raised", None, None))
        self.assertIsNone(truthcheck.bad_verify(rec))

    def test_launch_varied_padded_failing(self):
        """Through launch.py and the collector: the options reach the server, a
        /verify 500 fails its rollout only (counted, not retried), the truth agrees."""
        truth = os.path.join(self.tmp, "truth.jsonl")
        r, ev = launch("--rollouts", "16", "--concurrency", "4", "--truth", truth, "--check-truth", "--log-dir", self.tmp,
                       "--rewards", "varied", "--reward-seed", "5", "--verify-pad", "64", "--verify-fail-rate", "0.25")
        self.assertEqual(ev["ready"]["verify"], {"rewards": "varied", "reward_seed": 5, "verify_pad_kib": 64,
                                                 "verify_fail_rate": 0.25})
        tc, summ = ev["truth_check"], ev["summary"]
        self.assertTrue(tc["ok"], tc)
        v = truthcheck.verify_ins(truthcheck.load(truth))
        failed = [x for x in v if x["status"] == 500]
        ok = [x for x in v if x["status"] == 200]
        self.assertEqual(len(v), 16)
        self.assertTrue(0 < len(failed) < 16, [x["status"] for x in v])
        self.assertEqual((tc["verify_failed"], summ["failed"], summ["ok"]), (len(failed), len(failed), len(ok)))
        self.assertEqual(summ["failed_by"], {"resources /verify answered 500": len(failed)})
        self.assertEqual(r.returncode, 1)  # some rollout failed
        self.assertEqual(tc["out_errors"], 0)  # nothing retried
        self.assertTrue(all(x["body_bytes"] > 64 * 1024 and x["session_ok"] for x in ok))
        self.assertAlmostEqual(summ["reward_mean"], sum(x["reward"] for x in ok) / len(ok), places=3)
        self.assertEqual(set(ev["stopped"]["exit_codes"].values()), {0})


class NgRunTest(unittest.TestCase):
    def test_ng_run_is_the_servers_parent_and_stops_them(self):
        self.check_ng_run([NG_RUN])

    def test_launch_exec_ng_run(self):
        # As test/e2e's startStack runs it: launch.py --serve --warmup 2 ARGS.
        self.check_ng_run([PY, LAUNCH, "--serve", "--warmup", "2", "--exec-ng-run"])

    def check_ng_run(self, argv):
        tmp = tempfile.mkdtemp(prefix="gymstack-test-")
        r = subprocess.Popen(argv + ["--log-dir", tmp, "--rewards", "varied"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            ready = json.loads(r.stdout.readline())
            self.assertEqual(ready["event"], "ready", ready)
            self.assertEqual((ready["launcher"], ready["launcher_pid"]), ("ng_run", r.pid))
            with open(f"/proc/{r.pid}/comm") as f:
                self.assertEqual(f.read().strip(), "ng_run")  # what discovery's table matches
            with open(f"/proc/{r.pid}/cmdline", "rb") as f:
                self.assertEqual(os.path.basename(f.read().split(b"\0")[1]), b"ng_run")
            for s in ready["servers"].values():
                with open(f"/proc/{s['pid']}/status") as f:
                    ppid = int(next(ln for ln in f if ln.startswith("PPid:")).split()[1])
                self.assertEqual(ppid, r.pid, s)
                st, _, raw = http("GET", s["url"] + "/")
                self.assertEqual((st, json.loads(raw)["pid"]), (200, s["pid"]))
            c = subprocess.run(ready["collector_argv"] + ["--rollouts", "2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(c.returncode, 0, c.stderr)
        finally:
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=30)
        self.assertEqual(r.returncode, 0, err)
        self.assertEqual(json.loads(out.splitlines()[-1]), {"event": "stopped", "exit_codes": {"resources": 0, "model": 0, "agent": 0}})
        for s in ready["servers"].values():
            self.assertFalse(os.path.exists(f"/proc/{s['pid']}"), f"{s['name']} still running")


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
            out, err = r.communicate(timeout=60)
            return [json.loads(x) for x in out.splitlines() if x.strip()]
        if ready.get("event") != "ready":
            stop()
            self.fail(f"the stack did not start: {ready}")
        return ready, stop

    def collect(self, ready, n, *extra):
        c = subprocess.run(ready["collector_argv"] + ["--rollouts", str(n), "--concurrency", "2", *extra],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(c.returncode, 0, c.stderr[-2000:])
        return json.loads(c.stdout.splitlines()[-1])

    def test_per_rollout_spans_join_across_servers(self):
        args, d, inside = self.sid_args("per_rollout")
        truth = os.path.join(inside, "truth.jsonl")
        r = subprocess.run([PY, LAUNCH, *args, "--gym-telemetry", "file", "--gym-telemetry-out", os.path.join(inside, "tel"),
                            "--gym-span-groups", "per_rollout", "--truth", truth, "--rollouts", "4", "--concurrency", "2"],
                           capture_output=True, text=True, timeout=180)
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
                            "--gym-span-groups", "server", "--rollouts", "2"], capture_output=True, text=True, timeout=180)
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


class DefaultStackTest(unittest.TestCase):
    def test_default_stack_does_not_import_opentelemetry(self):
        code = ("import sys; sys.path.insert(0, %r); import stacklib, agent, model, resources, collector; "
                "print(sorted(m for m in sys.modules if m == 'gymtel' or m.startswith('opentelemetry')))") % HERE
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True)
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "[]"), out.stderr)


if __name__ == "__main__":
    unittest.main()
