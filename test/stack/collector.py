"""Gym-shaped rollout collector, like ng_collect_rollouts.

Sends one POST /run per row to the agent with at most --concurrency in flight
(asyncio.Semaphore), all over ONE keep-alive aiohttp ClientSession, then
prints a one-line JSON summary on stdout and exits (0 when every rollout
succeeded, 1 otherwise).
"""

import argparse
import asyncio
import collections
import json
import os
import sys
import time

import gymclient
import stacklib

ROUTES = ["responses", "chat_completions", "messages"]


def build_rows(a):
    return [build_row(a, i) for i in range(a.rollouts)]


def build_row(a, i):
    content = f"What is the weather? (task {i // a.repeats})"
    kib = 0
    if a.large_bodies:
        # A whole conversation, as Gym's model calls carry: 80 to 200 KiB,
        # different per row.
        kib = 80 + (i * 37) % 121
        content += " " + ("lorem ipsum " * (kib * 1024 // 12 + 1))[:kib * 1024]
    ids = {"_ng_task_index": i // a.repeats, "_ng_rollout_index": i % a.repeats}
    if a.attempt_index is not None:
        ids["_ng_attempt_index"] = a.attempt_index
    if a.explicit_ids:
        ids["_ng_rollout_id"] = f"r{i:05d}"
    # With large bodies the _ng_* keys go last, after the large content
    # (json keeps insertion order), as in a Gym row whose fields come first.
    row = {} if a.large_bodies else dict(ids)
    row["responses_create_params"] = {"input": [{"role": "user", "content": content}]}
    knobs = {"turns": a.turns}
    if kib:
        knobs["body_kib"] = kib
    knobs["model_route"] = ROUTES[i % 3] if a.model_route == "mixed" else a.model_route
    if a.stream:
        knobs["stream"] = True
    if a.genai:
        knobs["genai"] = i
    if a.prefix == "all" or (a.prefix == "mixed" and i % 2 == 1):
        knobs["prefix"] = True
    if a.sandbox:
        knobs["sandbox"] = a.sandbox
        knobs["sandbox_rc"] = a.sandbox_rc
    if a.verify_sandbox:
        knobs["verify_sandbox"] = a.verify_sandbox
    if a.fail_every and (i + 1) % a.fail_every == 0:
        knobs["fail"] = 500
    row["gt"] = knobs
    if a.large_bodies:
        row.update(ids)
    return row


def agent_url_from_config(name):
    raw = os.environ.get("NEMO_GYM_CONFIG_DICT")
    if not raw:
        raise SystemExit("no agent: pass --agent-url http://HOST:PORT, or set NEMO_GYM_CONFIG_DICT and --agent-name")
    import yaml
    cfg = yaml.safe_load(raw)
    fake = stacklib.ServerConfig("collector", "orchestrator", "collector", {}, cfg)
    return fake.url_of(name)


async def collect(a, rows):
    truth = stacklib.Truth(a.truth, "collector", "orchestrator")
    client = gymclient.GymClient(truth, max_retries=a.max_retries, split_heads=a.split_heads)
    await client.start()
    sem = asyncio.Semaphore(a.concurrency)
    results = []

    async def one(row):
        rid = stacklib.gym_rollout_id(row)
        async with sem:
            t0 = time.perf_counter()
            try:
                r = await client.post(a.agent_url + "/run", cause=None, json_body=row, rollout_id=rid)
                ok = r.status == 200
                res = {"rollout_id": rid, "status": r.status,
                       "reward": r.body.get("reward") if ok and isinstance(r.body, dict) else None}
                if not ok:
                    res["error"] = json.dumps(r.body)[:300]
                    # The agent names the hop that failed ("resources /verify answered 500"):
                    # like Gym's collector, count the failed rollout and go on.
                    detail = r.body.get("detail") if isinstance(r.body, dict) else None
                    res["failed_hop"] = detail if isinstance(detail, str) else f"/run answered {r.status}"
            except Exception as e:  # a dead agent must show up in the summary, not as a traceback
                res = {"rollout_id": rid, "status": None, "reward": None, "error": f"{type(e).__name__}: {e}",
                       "failed_hop": type(e).__name__}
            res["duration_s"] = round(time.perf_counter() - t0, 6)
            results.append(res)

    async def until(deadline, worker):
        # --duration: each of the --concurrency workers sends its next
        # rollout until the deadline, then the ones in flight finish.
        i = worker
        while time.perf_counter() < deadline:
            row = build_row(a, i)
            rows.append(row)
            await one(row)
            i += a.concurrency

    t0 = time.perf_counter()
    try:
        if a.duration:
            await asyncio.gather(*(until(t0 + a.duration, w) for w in range(a.concurrency)))
        else:
            await asyncio.gather(*(one(r) for r in rows))
        elapsed = time.perf_counter() - t0
        aggregate = None
        if a.aggregate:
            r = await client.post(a.agent_url + "/aggregate_metrics", cause=None, json_body={"rollouts": len(rows)})
            aggregate = r.body
    finally:
        await client.close()
        truth.close()
    return results, elapsed, aggregate


def main():
    p = argparse.ArgumentParser(description="Gym-shaped rollout collector (ng_collect_rollouts) for gymtrace tests")
    p.add_argument("--agent-url", help="agent base URL, e.g. http://127.0.0.1:12001")
    p.add_argument("--agent-name", default="simple_weather_simple_agent",
                   help="with NEMO_GYM_CONFIG_DICT set and no --agent-url: the agent's server name")
    p.add_argument("--rollouts", type=int, default=8, help="number of /run requests (rows)")
    p.add_argument("--concurrency", type=int, default=4, help="max /run requests in flight")
    p.add_argument("--duration", type=float, default=0,
                   help="send rollouts for this many seconds instead of --rollouts (then let those in flight finish)")
    p.add_argument("--repeats", type=int, default=1, help="rollouts per task: row i is task i//R, rollout i%%R")
    p.add_argument("--attempt-index", type=int, help="set _ng_attempt_index on every row (rollout id gets -aN)")
    p.add_argument("--explicit-ids", action="store_true", help="set _ng_rollout_id=rNNNNN on every row")
    p.add_argument("--turns", type=int, default=2, help="model+tool turns per rollout")
    p.add_argument("--model-route", choices=ROUTES + ["mixed", "cycle"], default="responses",
                   help="model route; mixed = by rollout, cycle = by turn")
    p.add_argument("--stream", action="store_true", help="model answers as SSE streams")
    p.add_argument("--genai", action="store_true",
                   help="model calls in every dialect and form with known models and token counts (genai.py)")
    p.add_argument("--large-bodies", action="store_true",
                   help="80-200 KiB conversations in /run, agent and model bodies both ways; _ng_* keys last")
    p.add_argument("--prefix", choices=["none", "all", "mixed"], default="none",
                   help="call /ng-rollout/<id>/... paths (mixed = odd rollouts)")
    p.add_argument("--sandbox", choices=["docker", "apptainer", "enroot"],
                   help="each rollout starts a sandbox and execs in it every turn (via resources /run_sandbox)")
    p.add_argument("--sandbox-rc", type=int, default=0, help="exit code the sandbox exec command asks for")
    p.add_argument("--verify-sandbox", choices=["docker", "apptainer", "enroot"], help="/verify execs in a sandbox")
    p.add_argument("--fail-every", type=int, default=0, help="every Nth rollout's first model call answers 500")
    p.add_argument("--aggregate", action="store_true", help="POST /aggregate_metrics to the agent at the end")
    p.add_argument("--max-retries", type=int, default=20, help="retries per call on dropped connections (Gym: forever)")
    p.add_argument("--split-heads", action="store_true",
                   help="each connection's first /run head in two writes, its request line first (needs --loop asyncio)")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--results", help="write one JSON line per rollout here")
    p.add_argument("--truth", default=os.environ.get("GYMTRACE_TEST_TRUTH"), help="ground-truth file (append)")
    a = p.parse_args()
    if a.rollouts < 0 or a.concurrency < 1 or a.repeats < 1 or a.duration < 0:
        p.error("--rollouts and --duration must be >= 0, --concurrency and --repeats >= 1")
    if a.split_heads and a.loop != "asyncio":
        p.error("--split-heads wraps the default loop's transports: use it with --loop asyncio")
    if not a.agent_url:
        a.agent_url = agent_url_from_config(a.agent_name)
    a.agent_url = a.agent_url.rstrip("/")

    rows = [] if a.duration else build_rows(a)
    if a.loop == "uvloop":
        import uvloop
        uvloop.install()
    results, elapsed, aggregate = asyncio.run(collect(a, rows))

    ok = sum(1 for r in results if r["status"] == 200)
    rewards = [r["reward"] for r in results if r["reward"] is not None]
    summary = {
        "event": "summary", "rollouts": len(rows), "ok": ok, "failed": len(rows) - ok,
        "concurrency": a.concurrency, "elapsed_s": round(elapsed, 4),
        "rollouts_per_s": round(len(rows) / elapsed, 2) if elapsed > 0 else None,
        "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "rollout_ids": [stacklib.gym_rollout_id(r) for r in rows],
        "errors": [r for r in results if r["status"] != 200][:5],
        "failed_by": dict(collections.Counter(r["failed_hop"] for r in results if r["status"] != 200)),
        "pid": os.getpid(),
    }
    if aggregate is not None:
        summary["aggregate"] = aggregate
    if a.results:
        with open(a.results, "w") as f:
            for r in sorted(results, key=lambda r: str(r["rollout_id"])):
                f.write(json.dumps(r) + "\n")
    print(json.dumps(summary), flush=True)
    sys.exit(0 if ok == len(rows) else 1)


if __name__ == "__main__":
    main()
