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
# A bound on a hang, not on speed: these tests run in CI beside the kernel
# matrix's QEMU guests, where a stack's servers took over 30 s to answer
# (launch.py --startup-timeout is 5 min per server).
HANG = 900
NG_RUN = os.path.join(HERE, "bin", "ng_run")


def launch(*args, timeout=HANG):
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


class PortPickTest(unittest.TestCase):
    """The launcher's three ports are distinct, and a server whose bind
    failed is not taken for ready because another answers on its port."""

    def test_free_port_skips_excluded(self):
        real = stacklib._ephemeral_range
        # Only 10000 and 10001 lie outside this "ephemeral range".
        stacklib._ephemeral_range = lambda: (10002, 65535)
        try:
            for _ in range(50):
                self.assertNotEqual(stacklib.free_port(exclude={10000}), 10000)
        finally:
            stacklib._ephemeral_range = real

    def test_ready_check_refuses_another_server(self):
        import http.server
        import threading
        import types
        import launch as launcher

        class Other(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"server": "someone_else"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), Other)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        proc = subprocess.Popen(["sleep", "30"])
        try:
            s = {"kind": "agent", "name": "simple_weather_simple_agent", "proc": proc,
                 "url": f"http://127.0.0.1:{srv.server_address[1]}", "log": os.devnull}
            with self.assertRaisesRegex(RuntimeError, "answered by 'someone_else'.*address already in use"):
                launcher.wait_ready(types.SimpleNamespace(startup_timeout=10, shell=False), s)
            s["name"] = "someone_else"
            launcher.wait_ready(types.SimpleNamespace(startup_timeout=10, shell=False), s)
        finally:
            proc.kill()
            proc.wait()
            srv.shutdown()
            srv.server_close()


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
        self.assertEqual(set(ev["stopped"]["exit_codes"].values()), {0}, r.stderr[-8000:])
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
            out, err = r.communicate(timeout=HANG)
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
            c = subprocess.run(ready["collector_argv"] + ["--rollouts", "3"], capture_output=True, text=True, timeout=HANG)
            self.assertEqual(c.returncode, 0, c.stderr)
            self.assertEqual(json.loads(c.stdout)["ok"], 3)
            # --duration: rollouts for that long (the bench's twin phase),
            # each with its own id, all of them finished. How many fit in
            # the time depends on the machine's load (CI's guests run beside
            # it), so the count is only bounded below by one per worker.
            c = subprocess.run(ready["collector_argv"] + ["--rollouts", "0", "--duration", "0.5", "--concurrency", "2"],
                               capture_output=True, text=True, timeout=HANG)
            self.assertEqual(c.returncode, 0, c.stderr)
            summary = json.loads(c.stdout)
            self.assertGreaterEqual(summary["rollouts"], 2, summary)
            # Worker w sends ids w, w+2, w+4...: each worker's are a run with no gap.
            tasks = sorted(int(r.split("-")[0]) for r in summary["rollout_ids"])
            for w in range(2):
                mine = [i for i in tasks if i % 2 == w]
                self.assertEqual(mine, list(range(w, w + 2 * len(mine), 2)), summary)
                self.assertTrue(mine, f"worker {w} sent no rollout: {summary}")
            self.assertEqual(summary["ok"], summary["rollouts"])
            self.assertEqual(len(set(summary["rollout_ids"])), summary["rollouts"])
            self.assertGreaterEqual(summary["elapsed_s"], 0.5)
        finally:
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=HANG)
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
        self.assertEqual(set(ev["stopped"]["exit_codes"].values()), {0}, r.stderr[-8000:])


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
            c = subprocess.run(ready["collector_argv"] + ["--rollouts", "2"], capture_output=True, text=True, timeout=HANG)
            self.assertEqual(c.returncode, 0, c.stderr)
        finally:
            r.send_signal(signal.SIGTERM)
            out, err = r.communicate(timeout=HANG)
        self.assertEqual(r.returncode, 0, err)
        self.assertEqual(json.loads(out.splitlines()[-1]), {"event": "stopped", "exit_codes": {"resources": 0, "model": 0, "agent": 0}})
        for s in ready["servers"].values():
            self.assertFalse(os.path.exists(f"/proc/{s['pid']}"), f"{s['name']} still running")


class DefaultStackTest(unittest.TestCase):
    def test_default_stack_does_not_import_opentelemetry(self):
        code = ("import sys; sys.path.insert(0, %r); import stacklib, agent, model, resources, collector; "
                "print(sorted(m for m in sys.modules if m == 'gymtel' or m.startswith('opentelemetry')))") % HERE
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True)
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "[]"), out.stderr)


if __name__ == "__main__":
    unittest.main()
