"""Self-tests of the Gym-shaped stack (no tracer involved).

    /usr/bin/python3 -m unittest discover -s test/stack -p 'test_*.py' -v
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)

import stacklib  # noqa: E402
import truthcheck  # noqa: E402

PY = "/usr/bin/python3"
LAUNCH = os.path.join(HERE, "launch.py")


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


if __name__ == "__main__":
    unittest.main()
