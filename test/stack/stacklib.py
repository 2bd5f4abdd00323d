"""Shared plumbing for the Gym-shaped test stack.

Everything here mirrors how NeMo Gym's servers behave on the wire: config from
NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH, JSON bodies, uvicorn with
timeout_keep_alive=30. The HTTP client (one global keep-alive aiohttp
ClientSession per process, retries on dropped connections) is gymclient.py.

The ground-truth log ("truth") is the only thing here Gym does not have. Its
ids live in the ASGI scope and in Python arguments only: they are never put on
the wire, in headers or in bodies, so a tracer cannot learn them.
"""

import argparse
import asyncio
import faulthandler
import itertools
import json
import os
import random
import re
import signal
import socket
import sys
import time

import yaml

SERVER_TYPES = {
    "agent": "responses_api_agents",
    "model": "responses_api_models",
    "resources": "resources_servers",
}

ROLLOUT_PREFIX_RE = re.compile(r"^/ng-rollout/([^/]+)(/.*)$")

# Gym retries dropped connections forever with 0.5 s sleeps; tests need an end.
RETRY_SLEEP_S = 0.5


def now_ns():
    return time.time_ns()


def mono_ns():
    # CLOCK_MONOTONIC, the clock bpf_ktime_get_ns() reads: lets a scorer match
    # kernel timestamps without wall-clock conversion error.
    return time.monotonic_ns()


# --------------------------------------------------------------------------
# Config, the way Gym passes it to each server process.


def host_for_url(host):
    return f"[{host}]" if ":" in host else host


class ServerConfig:
    """This process's entry in the Gym global config dict."""

    def __init__(self, name, server_type, impl, fields, global_cfg):
        self.name = name
        self.type = server_type
        self.impl = impl
        self.fields = fields
        self.global_cfg = global_cfg

    @property
    def host(self):
        return self.fields.get("host", "127.0.0.1")

    @property
    def port(self):
        return int(self.fields["port"])

    def url_of(self, ref):
        """Base URL of a server referenced as {type: ..., name: ...} or by name."""
        name = ref["name"] if isinstance(ref, dict) else ref
        entry = self.global_cfg.get(name)
        if not isinstance(entry, dict) or not entry:
            raise SystemExit(
                f"config error: server {name!r} is referenced by {self.name!r} but is not a "
                f"top-level key of NEMO_GYM_CONFIG_DICT (keys: {sorted(self.global_cfg)})"
            )
        _, (_, fields) = _unwrap(entry)
        return f"http://{host_for_url(fields.get('host', '127.0.0.1'))}:{int(fields['port'])}"


def _unwrap(entry):
    server_type = next(iter(entry))
    inner = entry[server_type]
    impl = next(iter(inner))
    return server_type, (impl, inner[impl])


def load_server_config(kind, args):
    """Read NEMO_GYM_CONFIG_DICT (YAML or JSON) and NEMO_GYM_CONFIG_PATH.

    Without them the server runs from flags alone (--name, --host, --port and
    --peers), which is handy when a test starts one server by hand.
    """
    raw = os.environ.get("NEMO_GYM_CONFIG_DICT")
    name = os.environ.get("NEMO_GYM_CONFIG_PATH")
    if raw and name:
        try:
            global_cfg = yaml.safe_load(raw)  # JSON is valid YAML
        except yaml.YAMLError as e:
            raise SystemExit(f"config error: NEMO_GYM_CONFIG_DICT is neither YAML nor JSON: {e}")
        if name not in global_cfg:
            raise SystemExit(
                f"config error: NEMO_GYM_CONFIG_PATH={name!r} is not a top-level key of "
                f"NEMO_GYM_CONFIG_DICT (keys: {sorted(global_cfg)})"
            )
        server_type, (impl, fields) = _unwrap(global_cfg[name])
        if server_type != SERVER_TYPES[kind]:
            raise SystemExit(
                f"config error: {name!r} has type {server_type!r} but this entry point serves "
                f"{SERVER_TYPES[kind]!r}"
            )
        fields = dict(fields)
    else:
        if args.port is None:
            raise SystemExit(
                "no config: set NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH as Gym does, "
                "or pass --port (and --peers for the agent)"
            )
        name = args.name or {"agent": "simple_agent", "model": "policy_model", "resources": "simple_weather"}[kind]
        server_type, impl = SERVER_TYPES[kind], kind
        fields = {}
        global_cfg = {name: {server_type: {impl: fields}}}
        for peer in (args.peers or "").split(","):
            if not peer:
                continue
            pkind, _, addr = peer.partition("=")
            host, _, port = addr.rpartition(":")
            pname = {"model": "policy_model", "resources": "simple_weather"}.get(pkind, pkind)
            global_cfg[pname] = {SERVER_TYPES[pkind]: {pkind: {"host": host.strip("[]"), "port": int(port)}}}
            fields[f"{pkind}_server"] = {"type": SERVER_TYPES[pkind], "name": pname}
    if args.host is not None:
        fields["host"] = args.host
    if args.port is not None:
        fields["port"] = args.port
    fields.setdefault("host", "127.0.0.1")
    return ServerConfig(name, server_type, impl, fields, global_cfg)


def server_arg_parser(kind):
    p = argparse.ArgumentParser(description=f"Gym-shaped {SERVER_TYPES[kind]} server for gymtrace tests")
    p.add_argument("--host", help="bind address (default: from config, else 127.0.0.1); ::1 for IPv6")
    p.add_argument("--port", type=int, help="port (default: from config)")
    p.add_argument("--name", help="server name when no NEMO_GYM_CONFIG_PATH is set")
    p.add_argument("--peers", help="without Gym config: model=HOST:PORT,resources=HOST:PORT")
    p.add_argument("--http", choices=["h11", "httptools"], default="h11", help="uvicorn HTTP implementation")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="event loop")
    p.add_argument("--reset-contextvars", action="store_true",
                   help="uvicorn's reset_contextvars: each request in a fresh contextvars.Context() (uvicorn >= 0.45)")
    p.add_argument("--connections", choices=["shared", "per-rollout"], default="shared",
                   help="outbound connections: one keep-alive pool for the process (Gym's), or a pool per rollout, "
                        "closed at the rollout's end, so each rollout's calls open new connections")
    p.add_argument("--truth", default=os.environ.get("GYMTRACE_TEST_TRUTH"),
                   help="append ground-truth JSON lines here (default: $GYMTRACE_TEST_TRUTH)")
    add_gym_telemetry_args(p)
    return p


def add_gym_telemetry_args(p):
    """Gym's own in-process telemetry (gymtel.py); off unless asked for."""
    p.add_argument("--gym-telemetry", choices=["off", "otlp", "noop", "file"], default="off",
                   help="set up Gym's own OpenTelemetry in the server (needs the OTel Python SDK): otlp = OTLP "
                        "http/protobuf to --gym-telemetry-endpoint, noop = exporters that do nothing, file = JSON "
                        "lines in --gym-telemetry-out DIR (default off: opentelemetry is not imported)")
    p.add_argument("--gym-span-groups", default="default", metavar="SPEC",
                   help="Gym's span_groups for --gym-telemetry (default: default)")
    p.add_argument("--gym-telemetry-endpoint", metavar="URL",
                   help="OTLP/HTTP base URL for --gym-telemetry otlp (http://HOST:PORT; /v1/traces and /v1/metrics)")
    p.add_argument("--gym-telemetry-out", metavar="DIR", help="directory for --gym-telemetry file")


# --------------------------------------------------------------------------
# Ground truth.


class Truth:
    """Buffered JSON-lines writer; each flush is one O_APPEND write.

    One write per flush keeps lines from several processes sharing the file
    whole (regular-file writes hold the inode lock) and keeps the file's own
    syscalls rare next to the socket traffic being traced.
    """

    def __init__(self, path, server, server_type):
        self.server = server
        self.type = server_type
        self.pid = os.getpid()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self.buf = []
        self._in_ids = itertools.count(1)
        self._out_ids = itertools.count(1)

    @property
    def enabled(self):
        return self.fd is not None

    def new_inbound_id(self):
        return f"{self.server}/{self.pid}/i{next(self._in_ids)}"

    def new_outbound_id(self):
        return f"{self.server}/{self.pid}/o{next(self._out_ids)}"

    def emit(self, rec):
        if self.fd is None:
            return
        rec.setdefault("server", self.server)
        rec.setdefault("type", self.type)
        rec.setdefault("pid", self.pid)
        self.buf.append(json.dumps(rec, separators=(",", ":")))
        if len(self.buf) >= 256:
            self.flush()

    def flush(self):
        if self.fd is None or not self.buf:
            return
        data = ("\n".join(self.buf) + "\n").encode()
        self.buf = []
        while data:
            n = os.write(self.fd, data)
            data = data[n:]

    async def flusher(self):
        while True:
            await asyncio.sleep(0.2)
            self.flush()

    def close(self):
        self.flush()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def addr_pair(sockaddr):
    if not sockaddr:
        return None
    return [sockaddr[0], sockaddr[1]]


class TruthMiddleware:
    """Outermost pure-ASGI middleware: gives each inbound request a local id.

    Pure ASGI (not BaseHTTPMiddleware) so it adds no task of its own: the
    request still runs in the task uvicorn created for it.
    """

    def __init__(self, app, truth):
        self.app = app
        self.truth = truth

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = self.truth.new_inbound_id()
        scope["gt_inbound"] = rid
        path = scope["path"]
        method = scope["method"]
        status = [None]
        end = [None, None]
        body_left = [None]  # bytes still to send when Content-Length is known

        async def send_status(message):
            # The end time is taken before the last body byte is handed to the
            # socket, so the caller's own end time is always later: an inbound
            # request lies inside the outbound call that produced it. With a
            # Content-Length that is when the counted bytes are all out (a
            # BaseHTTPMiddleware sends an empty final message after them).
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                for k, v in message.get("headers", ()):
                    if k.lower() == b"content-length":
                        body_left[0] = int(v)
            elif message["type"] == "http.response.body" and end[0] is None:
                if body_left[0] is not None:
                    body_left[0] -= len(message.get("body", b""))
                if (body_left[0] is not None and body_left[0] <= 0) or not message.get("more_body", False):
                    end[0], end[1] = now_ns(), mono_ns()
            await send(message)

        t0, m0 = now_ns(), mono_ns()
        try:
            await self.app(scope, receive, send_status)
        except Exception:
            # A handler that raised: answer what Starlette's outer
            # ServerErrorMiddleware would (500 "Internal Server Error"), but
            # through send_status so the end time is taken as for any answer.
            # Re-raised, so uvicorn logs it and closes the connection, as for a
            # Gym server whose handler raised. Unlike Gym's, the answer says
            # "Connection: close": the client then never reuses the socket
            # uvicorn is closing (a reset and a retry, at random, otherwise).
            if status[0] is None:
                from starlette.responses import PlainTextResponse
                await PlainTextResponse("Internal Server Error", status_code=500,
                                        headers={"connection": "close"})(scope, receive, send_status)
            raise
        finally:
            if self.truth.enabled:
                route = scope.get("route")
                rec = {
                    "ev": "in", "id": rid, "method": method, "path": path,
                    "route": getattr(route, "path", None),
                    "local": addr_pair(scope.get("server")), "peer": addr_pair(scope.get("client")),
                    "status": status[0] if status[0] is not None else 500,
                    "rollout_id": scope.get("gt_rollout_id"),
                    "t_start": t0, "t_end": end[0] or now_ns(), "mono_start": m0, "mono_end": end[1] or mono_ns(),
                }
                rec.update(scope.get("gt_extra") or {})  # route-specific fields (resources /verify: the reward)
                self.truth.emit(rec)


class StripRolloutPrefix:
    """Model and resources servers serve /ng-rollout/<id>/X as /X, as Gym does."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            m = ROLLOUT_PREFIX_RE.match(scope["path"])
            if m:
                # In place, so the outer truth middleware still sees the
                # route FastAPI records in the scope.
                scope["gt_rollout_id"] = m.group(1)
                scope["path"] = m.group(2)
                scope["raw_path"] = m.group(2).encode()
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------
# Gym's rollout id.


def gym_rollout_id(row):
    if row.get("_ng_rollout_id") is not None:
        return str(row["_ng_rollout_id"])
    if "_ng_task_index" in row and "_ng_rollout_index" in row:
        rid = f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
        if row.get("_ng_attempt_index") is not None:
            rid += f"-a{row['_ng_attempt_index']}"
        return rid
    return None


# --------------------------------------------------------------------------
# Running a server.


def session_cookie_name(class_name, server_name):
    return f"{class_name}___{server_name}"


def dump_tasks():
    tasks = asyncio.all_tasks()
    print(f"SIGUSR1: {len(tasks)} asyncio tasks", file=sys.stderr)
    for t in tasks:
        print(f"--- {t!r}", file=sys.stderr)
        t.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def install_lifecycle(app, cfg, truth, client, args):
    @app.on_event("startup")
    async def _startup():
        # SIGUSR1 (launch.py, before it kills a server that ignored
        # SIGTERM): what the loop is waiting on, into this server's log. No
        # dump at all means the loop itself was blocked.
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
        await client.start()
        if truth.enabled:
            app.state.gt_flusher = asyncio.get_running_loop().create_task(truth.flusher())
            truth.emit({"ev": "start", "host": cfg.host, "port": cfg.port, "http": args.http,
                        "loop": args.loop, "python": sys.version.split()[0], "t_start": now_ns()})
            truth.flush()

    @app.on_event("shutdown")
    async def _shutdown():
        await client.close()
        truth.close()
        # Past this the loop ends and closes, which takes SIGUSR1's handler
        # with it: a server launch.py found alive 10 s after SIGTERM died of
        # that SIGUSR1 (exit -10, ci27), so it hung after its loop, in the
        # interpreter's exit. If this process is still here in 8 s, the
        # stacks of all its threads go to its log (a C watchdog thread: it
        # needs neither the loop nor the main thread).
        faulthandler.dump_traceback_later(8, exit=False)


def serve(app, cfg, args, client=None):
    import uvicorn

    # SIGUSR2 (launch.py, before it kills a server that outlived SIGTERM):
    # every thread's Python stack into this server's log, wherever the
    # process is, its loop running, blocked, or gone.
    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)

    telemetry = None
    if getattr(args, "gym_telemetry", "off") != "off":
        import gymtel  # only here: the default stack never imports opentelemetry

        kind = next(k for k, t in SERVER_TYPES.items() if t == cfg.type)
        telemetry = gymtel.setup(app, cfg, kind, client, args)

    extra = {}
    if getattr(args, "reset_contextvars", False):
        import inspect
        if "reset_contextvars" not in inspect.signature(uvicorn.Config).parameters:
            sys.exit(f"--reset-contextvars: uvicorn {uvicorn.__version__} has no reset_contextvars (0.45 and later do)")
        extra["reset_contextvars"] = True
    if os.environ.get("GYMTRACE_TEST_LOG_READS") and args.http == "httptools":
        import readlog

        readlog.install()
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, http=args.http, loop=args.loop,
        timeout_keep_alive=30, log_level="warning", access_log=False, lifespan="on", **extra,
    )
    tel_note = f", gym telemetry {args.gym_telemetry} groups {args.gym_span_groups!r}" if telemetry else ""
    print(f"{cfg.type} {cfg.name} starting on http://{host_for_url(cfg.host)}:{cfg.port} "
          f"(pid {os.getpid()}, http={args.http}, loop={args.loop}{tel_note})", file=sys.stderr, flush=True)
    uvicorn.Server(config).run()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host="127.0.0.1", exclude=()):
    """A port on host that was free a moment ago, outside the ephemeral range
    and not in exclude.

    bind(0) hands out an ephemeral port, and any outbound connect() on the
    machine may take that same port as its source port before the server binds
    it. connect() never picks a port below the ephemeral range, so pick there
    (the same rule as the Go tests' test/freeport). The probe socket is closed
    before returning, so ports picked one after another for servers not yet
    started can come out the same: pass the ones already picked as exclude."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    lo, hi = _ephemeral_range()
    pool = [p for p in range(10000, 65536) if not lo <= p <= hi and p not in exclude]
    for _ in range(200 if pool else 0):
        port = random.choice(pool)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    for _ in range(200):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise OSError(f"no free TCP port on {host} outside {sorted(exclude)}")
