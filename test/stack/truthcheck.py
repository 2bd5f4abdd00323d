#!/usr/bin/python3
"""Check a ground-truth file written by the test stack, and show how to join it.

    /usr/bin/python3 test/stack/truthcheck.py TRUTH.jsonl

Every outbound call ("out") is matched to the inbound request ("in") it
produced on the other server: same TCP ports (out.local = in.peer,
out.remote port = in.local port) and the inbound lies inside the outbound in
CLOCK_MONOTONIC time. A scorer matches exported spans the same way: a CLIENT
span to an "out" by network.local.port / server.port and time, a SERVER span
to an "in" by client.port / server.port and time; the CLIENT span's true
parent is then the span of the "in" named by the out's "cause".

Each resources /verify "in" also says what it answered: reward (float),
reward_text (the number exactly as written in the body), reward_form,
session_ok, verify_outcome and body_bytes; check() verifies they agree with
each other and with the status.
"""

import collections
import json
import re
import sys

# RFC 8259 number grammar: what a reward's text must match.
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def load(path):
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                recs.append(json.loads(line))
            except ValueError as e:
                raise SystemExit(f"{path}:{n}: not JSON ({e}); was the file written by two stacks at once?")
    return recs


def join(recs):
    """Returns (pairs, unmatched_out, ambiguous_out, unmatched_in): pairs maps an
    out id to the in record it produced."""
    ins = [r for r in recs if r["ev"] == "in"]
    by_ports = collections.defaultdict(list)
    for r in ins:
        if r.get("peer") and r.get("local"):
            by_ports[(r["peer"][1], r["local"][1])].append(r)
    pairs, unmatched, ambiguous = {}, [], []
    for o in recs:
        if o["ev"] != "out" or o.get("error") or not o.get("local") or not o.get("remote"):
            continue
        cands = [r for r in by_ports.get((o["local"][1], o["remote"][1]), [])
                 if o["mono_start"] <= r["mono_start"] and r["mono_end"] <= o["mono_end"]]
        if len(cands) == 1:
            pairs[o["id"]] = cands[0]
        elif cands:
            ambiguous.append(o)
        else:
            unmatched.append(o)
    produced = {r["id"] for r in pairs.values()}
    # GET / comes from the launcher's readiness probe, which writes no truth.
    unmatched_in = [r for r in ins if r["id"] not in produced and not (r["method"] == "GET" and r["path"] == "/")]
    return pairs, unmatched, ambiguous, unmatched_in


def verify_ins(recs):
    """The resources /verify "in" records (with their reward fields)."""
    return [r for r in recs if r["ev"] == "in" and r.get("route") == "/verify"]


def bad_verify(r):
    """Why a /verify "in" record is inconsistent, or None. Records from
    before the reward fields existed are not checked."""
    if "verify_outcome" not in r:
        return None
    if r["verify_outcome"] == "reward":
        if r["status"] != 200:
            return f"reward answered with status {r['status']}"
        text = r.get("reward_text")
        if not isinstance(text, str) or not JSON_NUMBER.fullmatch(text):
            return f"reward_text {text!r} is not a JSON number"
        if not isinstance(r.get("reward"), (int, float)) or float(text) != r["reward"]:
            return f"reward {r.get('reward')!r} is not the value of reward_text {text!r}"
        return None
    if r["status"] == 200:
        return f"verify_outcome {r['verify_outcome']!r} with status 200"
    if r.get("reward") is not None or r.get("reward_text") is not None:
        return "a failed /verify carries a reward"
    return None


def check(path):
    recs = load(path)
    in_ids = {r["id"] for r in recs if r["ev"] == "in"}
    outs = [r for r in recs if r["ev"] == "out"]
    spawns = [r for r in recs if r["ev"] == "spawn"]
    missing_cause = [r for r in outs + spawns if r.get("cause") is not None and r["cause"] not in in_ids]
    no_socket = [r for r in outs if not r.get("error") and not r.get("local")]
    pairs, unmatched, ambiguous, unmatched_in = join(recs)
    runs = [r for r in recs if r["ev"] == "in" and r["path"] == "/run"]
    verifies = verify_ins(recs)
    bad_verifies = [dict(r, why=bad_verify(r)) for r in verifies if bad_verify(r)]
    res = {
        "records": len(recs), "in": len(in_ids), "out": len(outs), "spawn": len(spawns),
        "out_errors": sum(1 for r in outs if r.get("error")),
        "joined": len(pairs), "unmatched_out": len(unmatched), "ambiguous_out": len(ambiguous),
        "unmatched_in": len(unmatched_in), "missing_cause": len(missing_cause), "out_without_socket": len(no_socket),
        "runs": len(runs), "rollout_ids": len({r.get("rollout_id") for r in runs}),
        "verify": len(verifies), "verify_ok": sum(1 for r in verifies if r["status"] == 200),
        "verify_failed": sum(1 for r in verifies if r["status"] != 200),
        "reward_forms": dict(collections.Counter(r["reward_form"] for r in verifies if r.get("reward_form"))),
        "bad_verify": len(bad_verifies),
    }
    res["ok"] = not (missing_cause or no_socket or unmatched or ambiguous or unmatched_in or bad_verifies)
    examples = (missing_cause + no_socket + unmatched + ambiguous + unmatched_in + bad_verifies)[:3]
    if examples:
        res["examples"] = examples
    return res


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: truthcheck.py TRUTH.jsonl")
    result = check(sys.argv[1])
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
