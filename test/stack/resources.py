"""Gym-shaped resources server (resources_servers): simple_weather.

Routes: POST /seed_session, /verify, /aggregate_metrics, GET /reverify_mode,
tools POST /get_weather and POST /run_sandbox, GET / (health). A leading
/ng-rollout/<id> is stripped, as in Gym.
"""

import asyncio
import os
import shutil
import uuid

from fastapi import FastAPI, HTTPException, Request
from starlette.middleware.sessions import SessionMiddleware

import stacklib

CLASS_NAME = "SimpleWeatherResourcesServer"

# Per-session state lives server side, keyed by the id in the session cookie,
# so the reward is 1.0 only when the agent forwarded the cookie on every hop.
SESSIONS = {}
SYSTEM_BIN_DIRS = {"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin", "/usr/local/sbin", "/snap/bin"}
METRICS = {"verified": 0, "reward_sum": 0.0}


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
        reward = 1.0 if ok else 0.0
        METRICS["verified"] += 1
        METRICS["reward_sum"] += reward
        return {"reward": reward, "session_found": state is not None,
                "tool_calls": state["tool_calls"] if state else 0}

    @app.post("/aggregate_metrics")
    async def aggregate_metrics(request: Request):
        await request.body()
        n = METRICS["verified"]
        return {"verified": n, "mean_reward": METRICS["reward_sum"] / n if n else 0.0}

    @app.get("/reverify_mode")
    async def reverify_mode():
        return {"reverify_mode": False}

    return app


def main():
    args = stacklib.server_arg_parser("resources").parse_args()
    cfg = stacklib.load_server_config("resources", args)
    cfg.args = args
    truth = stacklib.Truth(args.truth, cfg.name, cfg.type)
    client = stacklib.GymClient(truth)
    stacklib.serve(build_app(cfg, truth, client), cfg, args)


if __name__ == "__main__":
    main()
