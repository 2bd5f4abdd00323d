"""Gym-shaped resources server (resources_servers): simple_weather.

Routes: POST /seed_session, /verify, /aggregate_metrics, GET /reverify_mode,
tools POST /get_weather and POST /run_sandbox, GET / (health). A leading
/ng-rollout/<id> is stripped, as in Gym.

/verify answers reward 1.0 when the session cookie made it through every hop,
else 0.0. Options for metric tests (see README.md): --rewards varied
(--reward-seed N) draws seeded rewards written in several JSON number forms,
--verify-pad KIB echoes the request, pads the body past KIB KiB and puts decoy
"reward"s before the real one (always the last key), --verify-fail-rate F
makes that fraction of calls raise (HTTP 500).
"""

import asyncio
import json
import os
import random
import shutil
import uuid

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.middleware.sessions import SessionMiddleware

import gymclient
import stacklib

CLASS_NAME = "SimpleWeatherResourcesServer"

# Per-session state lives server side, keyed by the id in the session cookie,
# so the reward is 1.0 only when the agent forwarded the cookie on every hop.
SESSIONS = {}
SYSTEM_BIN_DIRS = {"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin", "/usr/local/sbin", "/snap/bin"}
METRICS = {"verified": 0, "reward_sum": 0.0, "failed": 0}

# The varied reward forms, as JSON number text. Every block of len(FORMS)
# consecutive drawn rewards has one of each, in a seeded order.
FORMS = ("int", "neg_int", "frac", "exp", "EXP", "long")
# Decoys in padded answers (--verify-pad): none is a value a real reward can
# take (real ones lie in (-1000, 1000)).
DECOY_NESTED = "98765.4321"   # "reward" key inside the echoed request object
DECOY_DEEP = "-4242.5"        # "reward" key one level further down
DECOY_STRING = 12345          # inside a JSON string: {\"reward\": 12345}
DECOY_NEAR_KEY = "4321"       # top-level "reward_std", just before "reward"


class VerifyFailure(Exception):
    """A verify function that raised (--verify-fail-rate): uvicorn answers 500."""


def reward_text(rng, form):
    """One reward as JSON number text in the given form."""
    if form == "int":
        return str(rng.randint(0, 9))                          # "7"
    if form == "neg_int":
        return str(rng.randint(-9, -1))                        # "-3"
    if form == "frac":
        return repr(rng.choice([n for n in range(-16, 17) if n % 8]) / 8)  # "0.125", "-1.5"
    if form == "exp":
        m = rng.choice([n for n in range(-99, 100) if n % 10]) / 10
        return f"{m!r}e{rng.randint(-5, -1)}"                  # "-1.5e-3"
    if form == "EXP":
        return f"{rng.choice([n for n in range(-9, 10) if n])}E{rng.randint(-2, 2):+d}"  # "2E+2", "-7E-1"
    if form == "long":
        return f"{rng.randint(-9, 9)}.{rng.randint(1, 999999):06d}"  # "7.000001"
    raise ValueError(form)


class RewardSource:
    """Seeded draws: the n-th drawn reward and the n-th fail decision depend on
    the seed and n only (two separate streams), not on timing."""

    def __init__(self, mode, seed, fail_rate):
        self.mode = mode
        self.fail_rate = fail_rate
        self.rng = random.Random(f"gymstack-reward/{seed}")
        self.fail_rng = random.Random(f"gymstack-verify-fail/{seed}")
        self.block = []

    def fails(self):
        # Drawn on every call when a rate is set, so the decision sequence is fixed.
        return self.fail_rate > 0 and self.fail_rng.random() < self.fail_rate

    def reward(self, session_ok):
        """(text, form) of the reward to answer."""
        if not session_ok:
            return "0.0", "binary"  # the cookie did not make it: no draw
        if self.mode == "binary":
            return "1.0", "binary"
        if not self.block:
            self.block = list(FORMS)
            self.rng.shuffle(self.block)
        form = self.block.pop()
        return reward_text(self.rng, form), form


def verify_body(request_body, session_found, tool_calls, text, pad_kib):
    """The /verify answer as JSON text, the top-level "reward" always last and
    written as text (so 2E+2 stays 2E+2 on the wire)."""
    head = f'"session_found":{json.dumps(session_found)},"tool_calls":{tool_calls}'
    if not pad_kib:
        return f'{{{head},"reward":{text}}}'.encode()
    # Gym's verify responses extend the request; here it is echoed whole, with
    # decoy rewards inside it and inside a string before the real one.
    if not isinstance(request_body, dict):
        request_body = {"body": request_body}
    inner = json.dumps(request_body, separators=(",", ":"))[1:-1]
    echo = f'{{{inner}{"," if inner else ""}"grader":{{"reward":{DECOY_DEEP}}},"reward":{DECOY_NESTED}}}'
    decoy = json.dumps({"reward": DECOY_STRING})  # {"reward": 12345}, escaped inside the string below

    def build(filler):
        transcript = json.dumps(f"grader said {decoy}; {filler}; grader said {decoy}")
        return (f'{{"request":{echo},{head},"transcript":{transcript},'
                f'"reward_std":{DECOY_NEAR_KEY},"reward":{text}}}').encode()

    fill = max(0, pad_kib * 1024 + 1 - len(build("")))  # ASCII filler: one byte per character
    return build(("lorem ipsum " * (fill // 12 + 1))[:fill])


def sandbox_argv(provider, verb, name, cmd):
    if provider == "docker":
        if verb == "start":
            return ["docker", "run", "-d", "--name", name, "python:3.12-slim", "sleep", "infinity"]
        return ["docker", "exec", name, "sh", "-c", cmd]
    if provider == "apptainer":
        if verb == "start":
            return ["apptainer", "instance", "start", "python_3.12.sif", name]
        return ["apptainer", "exec", f"instance://{name}", "sh", "-c", cmd]
    if provider == "enroot":
        if verb == "start":
            return ["enroot", "start", name]
        return ["enroot", "exec", name, "sh", "-c", cmd]
    raise HTTPException(400, f"unknown sandbox provider {provider!r}: use docker, apptainer or enroot")


def build_app(cfg, truth, client):
    args = cfg.args
    rewards = RewardSource(args.rewards, args.reward_seed, args.verify_fail_rate)
    app = FastAPI()
    app.add_middleware(SessionMiddleware, secret_key="gymtrace-test",
                       session_cookie=stacklib.session_cookie_name(CLASS_NAME, cfg.name))
    app.add_middleware(stacklib.StripRolloutPrefix)
    app.add_middleware(stacklib.TruthMiddleware, truth=truth)
    stacklib.install_lifecycle(app, cfg, truth, client, cfg.args)

    async def run_sandbox_cli(cause, provider, verb, name, cmd):
        argv = sandbox_argv(provider, verb, name, cmd)
        found = shutil.which(argv[0])
        if found is None:
            raise HTTPException(500, f"sandbox CLI {argv[0]!r} not found on PATH "
                                     f"({os.environ.get('PATH', '')}); put a fake one first on PATH "
                                     "(launch.py --fakebin or --path-prepend DIR)")
        if os.path.dirname(os.path.realpath(found)) in SYSTEM_BIN_DIRS and not os.environ.get("GYMSTACK_REAL_SANDBOX"):
            # A test that forgot its fakes must not start real containers.
            raise HTTPException(500, f"refusing to run the system's {found} from a test: put a fake "
                                     f"{argv[0]} first on PATH, or set GYMSTACK_REAL_SANDBOX=1 to mean it")
        t0, m0 = stacklib.now_ns(), stacklib.mono_ns()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        rc = await proc.wait()
        truth.emit({"ev": "spawn", "id": truth.new_outbound_id(), "cause": cause, "child_pid": proc.pid,
                    "provider": provider, "verb": verb, "return_code": rc,
                    "t_start": t0, "t_end": stacklib.now_ns(), "mono_start": m0, "mono_end": stacklib.mono_ns()})
        return rc, proc.pid

    @app.get("/")
    async def health():
        return {"server": cfg.name, "type": cfg.type, "pid": os.getpid()}

    @app.post("/seed_session")
    async def seed_session(request: Request):
        body = await request.json()
        await asyncio.sleep(0.002)
        sid = uuid.uuid4().hex
        request.session["session_id"] = sid
        SESSIONS[sid] = {"tool_calls": 0, "expected_calls": int(body.get("expected_tool_calls", 1))}
        return {"seeded": True}

    def session_state(request):
        sid = request.session.get("session_id")
        return SESSIONS.get(sid) if sid else None

    @app.post("/get_weather")
    async def get_weather(request: Request):
        body = await request.json()
        await asyncio.sleep(0.002)
        state = session_state(request)
        if state is not None:
            state["tool_calls"] += 1
        city = body.get("city", "Paris")
        return {"city": city, "weather": "sunny", "temperature_c": 21 + len(city) % 7}

    @app.post("/run_sandbox")
    async def run_sandbox(request: Request):
        body = await request.json()
        provider = body.get("provider", "docker")
        verb = body.get("verb", "exec")
        name = body.get("name", "gymtrace-sandbox")
        cmd = body.get("cmd", "exit 0")
        rc, pid = await run_sandbox_cli(request.scope["gt_inbound"], provider, verb, name, cmd)
        return {"provider": provider, "verb": verb, "return_code": rc, "pid": pid}

    @app.post("/verify")
    async def verify(request: Request):
        # What this call answered, for the truth's "in" line (README.md).
        extra = request.scope["gt_extra"] = {"reward": None, "reward_text": None, "reward_form": None,
                                             "session_ok": None, "verify_outcome": "error", "body_bytes": None}
        body = await request.json()
        await asyncio.sleep(0.002)
        sandbox = body.get("verify_sandbox")
        if sandbox:
            # Verifiers that execute code do it in a sandbox, from /verify.
            await run_sandbox_cli(request.scope["gt_inbound"], sandbox, "exec",
                                  body.get("sandbox_name", "gymtrace-sandbox"), "exit 0")
        sid = request.session.get("session_id")
        state = SESSIONS.pop(sid, None) if sid else None
        ok = state is not None and state["tool_calls"] >= state["expected_calls"]
        extra["session_ok"] = ok
        if rewards.fails():
            METRICS["failed"] += 1
            extra["verify_outcome"] = "raised"
            raise VerifyFailure("injected verify failure (--verify-fail-rate)")
        tool_calls = state["tool_calls"] if state else 0
        if args.rewards == "binary" and not args.verify_pad:
            # Today's answer, byte for byte: FastAPI's JSON of this dict.
            reward = 1.0 if ok else 0.0
            out = {"reward": reward, "session_found": state is not None, "tool_calls": tool_calls}
            text, form = json.dumps(reward), "binary"
            response = JSONResponse(out)
        else:
            text, form = rewards.reward(ok)
            reward = float(text)
            response = Response(verify_body(body, state is not None, tool_calls, text, args.verify_pad),
                                media_type="application/json")
        METRICS["verified"] += 1
        METRICS["reward_sum"] += reward
        extra.update(reward=reward, reward_text=text, reward_form=form, verify_outcome="reward",
                     body_bytes=len(response.body))
        return response

    @app.post("/aggregate_metrics")
    async def aggregate_metrics(request: Request):
        await request.body()
        n = METRICS["verified"]
        return {"verified": n, "mean_reward": METRICS["reward_sum"] / n if n else 0.0, "failed": METRICS["failed"]}

    @app.get("/reverify_mode")
    async def reverify_mode():
        return {"reverify_mode": False}

    return app


def main():
    p = stacklib.server_arg_parser("resources")
    p.add_argument("--rewards", choices=["binary", "varied"], default="binary",
                   help="binary: 1.0 when the session cookie made every hop, else 0.0; varied: seeded rewards in "
                        "several JSON number forms (int, negative int, fraction, 1.5e-3, 2E+2, 7.000001), "
                        "still 0.0 when the cookie check fails")
    p.add_argument("--reward-seed", type=int, default=0, help="seed of --rewards varied and --verify-fail-rate")
    p.add_argument("--verify-pad", type=int, default=0, metavar="KIB",
                   help="echo the request in the /verify answer and pad it past KIB KiB, with decoy rewards "
                        "before the real one (the last key)")
    p.add_argument("--verify-fail-rate", type=float, default=0.0, metavar="F",
                   help="this fraction of /verify calls raise, so uvicorn answers 500 (seeded)")
    args = p.parse_args()
    if args.verify_pad < 0 or not 0.0 <= args.verify_fail_rate <= 1.0:
        p.error("--verify-pad must be >= 0 and --verify-fail-rate in [0, 1]")
    cfg = stacklib.load_server_config("resources", args)
    cfg.args = args
    truth = stacklib.Truth(args.truth, cfg.name, cfg.type)
    client = gymclient.GymClient(truth)
    stacklib.serve(build_app(cfg, truth, client), cfg, args, client)


if __name__ == "__main__":
    main()
