#!/usr/bin/python3
"""Start the Gym-shaped test stack, optionally collect rollouts, then stop it.

    /usr/bin/python3 test/stack/launch.py --rollouts 8 --concurrency 4
    /usr/bin/python3 test/stack/launch.py --serve            # until SIGTERM/SIGINT
    /usr/bin/python3 test/stack/launch.py --rollouts 64 --wait-stdin -- --stream --model-route mixed

stdout carries only JSON lines, the first always {"event": "ready", ...};
human-readable progress goes to stderr. See README.md for the protocol.
"""

import argparse
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)

import stacklib  # noqa: E402
import truthcheck  # noqa: E402

SERVERS = [  # start order: dependencies first
    ("resources", "simple_weather", "simple_weather", "resources.py"),
    ("model", "policy_model", "openai_model", "model.py"),
    ("agent", "simple_weather_simple_agent", "simple_agent", "agent.py"),
]

EXIT_COLLECTOR_FAILED = 1
EXIT_USAGE = 2
EXIT_STARTUP = 3


def log(msg):
    print(f"launch: {msg}", file=sys.stderr, flush=True)


def emit(obj):
    print(json.dumps(obj), flush=True)


class Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def _die_with_parent():
    # A Go test that kills the launcher must not leak servers holding ports.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def parse_args(argv, prog=None, description=None):
    collector_extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, collector_extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog=prog,
                                description=description or "Start the Gym-shaped test stack (resources, model, agent) for gymtrace tests.",
                                epilog="Arguments after -- go to the collector (see collector.py --help).")
    p.add_argument("--host", default="127.0.0.1", help="bind address for every server (127.0.0.1 or ::1)")
    p.add_argument("--ports", help="AGENT,MODEL,RESOURCES ports (default: free ports)")
    p.add_argument("--http", choices=["h11", "httptools"], default="h11", help="uvicorn HTTP implementation")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="event loop of servers and collector")
    p.add_argument("--reset-contextvars", action="store_true",
                   help="uvicorn starts each request in a fresh contextvars.Context() (uvicorn >= 0.45)")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="interpreter command for the servers (shell-split, e.g. 'chroot /srv/trixie /usr/bin/python3')")
    p.add_argument("--stack-dir", default=HERE, help="this directory as the interpreter sees it (for chroots)")
    p.add_argument("--no-gym-env", action="store_true",
                   help="start the servers without Gym's environment (flags --name/--port/--peers only), "
                        "so nothing but their traffic tells their roles")
    p.add_argument("--shell", action="store_true",
                   help="start each server as Gym does: bash -c 'cd DIR && NEMO_GYM_CONFIG_DICT=... NEMO_GYM_CONFIG_PATH=... python X.py'")
    p.add_argument("--truth", help="ground-truth file every process appends to (see README.md)")
    p.add_argument("--log-dir", help="server logs go here (default: a new temp dir)")
    p.add_argument("--path-prepend", action="append", default=[], help="directory put first on the servers' PATH (repeatable)")
    p.add_argument("--fakebin", action="store_true", help="put test/stack/fakebin (fake docker/apptainer/enroot) first on PATH")
    p.add_argument("--model-latency-ms", type=float, default=5.0, help="model sleep per call")
    p.add_argument("--model-upstream", action="store_true",
                   help="the model server forwards each --genai call to a fake upstream LLM (upstream.py), "
                        "a process apart, not a Gym server (its ready entry: servers.upstream)")
    p.add_argument("--base-middleware", choices=["responses", "all", "none"], default="responses",
                   help="agent routes behind a BaseHTTPMiddleware")
    p.add_argument("--rewards", choices=["binary", "varied"], default="binary",
                   help="resources /verify rewards: binary (1.0 when the session cookie made every hop, else 0.0) or "
                        "varied (seeded, in several JSON number forms; still 0.0 when the cookie check fails)")
    p.add_argument("--reward-seed", type=int, default=0, help="seed of --rewards varied and --verify-fail-rate")
    p.add_argument("--verify-pad", type=int, default=0, metavar="KIB",
                   help="/verify echoes its request, padded past KIB KiB, with decoy rewards before the real (last) key")
    p.add_argument("--verify-fail-rate", type=float, default=0.0, metavar="F",
                   help="this fraction of /verify calls raise, answering HTTP 500 (seeded by --reward-seed)")
    stacklib.add_gym_telemetry_args(p)  # passed to every server only when on
    p.add_argument("--exec-ng-run", action="store_true",
                   help="first exec bin/ng_run with the other options: this same process (same pid) becomes the "
                        "servers' parent, named ng_run, and serves until SIGTERM/SIGINT")
    # A bound on failure, not on speed: beside the kernel matrix's QEMU
    # guests (CI), an agent server on sid's 3.14 printed nothing for 30 s
    # (CI of 133ca2c). A server that exits fails at once; a slow one is
    # logged with its time (wait_ready).
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for each server")
    p.add_argument("--warmup", type=int, default=0,
                   help="run N rollouts before printing the ready line, so pooled keep-alive connections already exist")
    p.add_argument("--rollouts", type=int, help="run the collector with N rollouts once the stack is ready")
    p.add_argument("--concurrency", type=int, default=4, help="collector concurrency")
    p.add_argument("--wait-stdin", action="store_true", help="after the ready line, wait for one line on stdin before collecting")
    p.add_argument("--serve", action="store_true", help="keep serving until SIGTERM/SIGINT (after collecting, if --rollouts)")
    p.add_argument("--check-truth", action="store_true", help="after collecting, check the truth file is complete and consistent")
    a = p.parse_args(argv)
    a.collector_extra = collector_extra
    if a.rollouts is None and not a.serve:
        p.error("nothing to do: pass --rollouts N, --serve, or both")
    if a.check_truth and not a.truth:
        p.error("--check-truth needs --truth FILE")
    if a.verify_pad < 0 or not 0.0 <= a.verify_fail_rate <= 1.0:
        p.error("--verify-pad must be >= 0 and --verify-fail-rate in [0, 1]")
    return a


def gym_config(a, ports):
    cfg = {}
    for kind, name, impl, entry in SERVERS:
        fields = {"entrypoint": entry, "host": a.host, "port": ports[kind]}
        if kind == "agent":
            fields["resources_server"] = {"type": "resources_servers", "name": "simple_weather"}
            fields["model_server"] = {"type": "responses_api_models", "name": "policy_model"}
        cfg[name] = {stacklib.SERVER_TYPES[kind]: {impl: fields}}
    return cfg


def server_flags(a, kind):
    flags = ["--http", a.http, "--loop", a.loop] + (["--reset-contextvars"] if a.reset_contextvars else [])
    if a.truth:
        flags += ["--truth", a.truth]
    if kind == "model":
        flags += ["--latency-ms", str(a.model_latency_ms)]
        if a.model_upstream:
            flags += ["--upstream", a.upstream_url]
    if kind == "agent":
        flags += ["--base-middleware", a.base_middleware]
    if a.gym_telemetry != "off":
        flags += ["--gym-telemetry", a.gym_telemetry, "--gym-span-groups", a.gym_span_groups]
        if a.gym_telemetry_endpoint:
            flags += ["--gym-telemetry-endpoint", a.gym_telemetry_endpoint]
        if a.gym_telemetry_out:
            flags += ["--gym-telemetry-out", a.gym_telemetry_out]
    if kind == "resources":  # only what differs from the defaults: default command lines stay as they were
        if a.rewards != "binary":
            flags += ["--rewards", a.rewards]
        if a.reward_seed:
            flags += ["--reward-seed", str(a.reward_seed)]
        if a.verify_pad:
            flags += ["--verify-pad", str(a.verify_pad)]
        if a.verify_fail_rate:
            flags += ["--verify-fail-rate", repr(a.verify_fail_rate)]
    return flags


def verify_options(a):
    return {"rewards": a.rewards, "reward_seed": a.reward_seed, "verify_pad_kib": a.verify_pad,
            "verify_fail_rate": a.verify_fail_rate}


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def python_pid(proc, entry, deadline):
    """In --shell mode the server is bash's child, unless bash exec'd it."""
    while time.monotonic() < deadline:
        for pid in [proc.pid] + children_of(proc.pid):
            if any(arg.endswith(entry.encode()) for arg in cmdline(pid)[1:]):
                return pid
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def start_upstream(a, log_dir, servers, exclude):
    """The fake upstream LLM (--model-upstream): no Gym environment, so
    nothing takes it for a Gym server."""
    port = stacklib.free_port(a.host, exclude=exclude)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_GYM_")}
    env["PYTHONUNBUFFERED"] = "1"
    in_place = os.path.realpath(a.stack_dir) == HERE
    entry = "upstream.py" if in_place else os.path.join(a.stack_dir, "upstream.py")
    argv = shlex.split(a.python) + [entry, "--host", a.host, "--port", str(port), "--http", a.http, "--loop", a.loop]
    logf = os.path.join(log_dir, "upstream.log")
    with open(logf, "wb") as out:
        proc = subprocess.Popen(argv, cwd=HERE if in_place else None, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    url = f"http://{stacklib.host_for_url(a.host)}:{port}"
    servers["upstream"] = {"kind": "upstream", "name": "fake_upstream", "type": "upstream", "proc": proc,
                           "pid": proc.pid, "host": a.host, "port": port, "url": url, "log": logf,
                           "entry": "upstream.py"}
    a.upstream_url = url
    wait_ready(a, servers["upstream"])


def start_servers(a, ports, log_dir, servers):
    """Starts the servers in order, adding each to servers as soon as it runs
    so the caller can stop what started when a later one fails."""
    if a.model_upstream:
        start_upstream(a, log_dir, servers, set(ports.values()))
    cfg_yaml = stacklib.yaml.safe_dump(gym_config(a, ports), sort_keys=False)
    path = list(a.path_prepend)
    if a.fakebin:
        path.append(os.path.join(HERE, "fakebin"))
    base_env = dict(os.environ)
    base_env.pop("NEMO_GYM_CONFIG_DICT", None)
    base_env.pop("NEMO_GYM_CONFIG_PATH", None)
    base_env["PATH"] = os.pathsep.join(path + [os.environ.get("PATH", "/usr/bin:/bin")])
    base_env["PYTHONUNBUFFERED"] = "1"
    python = shlex.split(a.python)
    # Gym runs `python app.py` from the server's directory; an interpreter in a
    # chroot sees another tree, so there the entry point is given in full.
    in_place = os.path.realpath(a.stack_dir) == HERE
    for kind, name, _impl, entry in SERVERS:
        logf = os.path.join(log_dir, f"{kind}.log")
        argv = python + [entry if in_place else os.path.join(a.stack_dir, entry)] + server_flags(a, kind)
        env = dict(base_env)
        if a.no_gym_env:
            argv += ["--name", name, "--host", a.host, "--port", str(ports[kind])]
            if kind == "agent":
                argv += ["--peers", ",".join(f"{k}={stacklib.host_for_url(a.host)}:{ports[k]}" for k in ("model", "resources"))]
            popen_argv, cwd = argv, HERE if in_place else None
        elif a.shell:
            command = ((f"cd {shlex.quote(HERE)} && " if in_place else "") + f"NEMO_GYM_CONFIG_DICT={shlex.quote(cfg_yaml)} "
                       f"NEMO_GYM_CONFIG_PATH={shlex.quote(name)} {shlex.join(argv)}")
            popen_argv, cwd = ["bash", "-c", command], None
        else:
            env["NEMO_GYM_CONFIG_DICT"] = cfg_yaml
            env["NEMO_GYM_CONFIG_PATH"] = name
            popen_argv, cwd = argv, HERE if in_place else None
        with open(logf, "wb") as out:
            proc = subprocess.Popen(popen_argv, cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
        servers[kind] = {"kind": kind, "name": name, "type": stacklib.SERVER_TYPES[kind], "proc": proc,
                         "pid": proc.pid, "host": a.host, "port": ports[kind],
                         "url": f"http://{stacklib.host_for_url(a.host)}:{ports[kind]}", "log": logf,
                         "entry": entry}
        # Wait for each before starting the next, as later ones call earlier ones.
        wait_ready(a, servers[kind])


def log_tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def wait_ready(a, s):
    start = time.monotonic()
    deadline = start + a.startup_timeout
    if a.shell:
        pid = python_pid(s["proc"], s["entry"], deadline)
        if pid is None:
            raise RuntimeError(f"{s['kind']} server did not start (bash exited {s['proc'].poll()}); "
                               f"log {s['log']}:\n{log_tail(s['log'])}")
        s["pid"], s["shell_pid"] = pid, s["proc"].pid
    last = None
    while time.monotonic() < deadline:
        if s["proc"].poll() is not None:
            raise RuntimeError(f"{s['kind']} server exited with {s['proc'].returncode} during startup; "
                               f"log {s['log']}:\n{log_tail(s['log'])}")
        try:
            with urllib.request.urlopen(s["url"] + "/", timeout=2) as r:
                body = r.read() if r.status == 200 else b""
        except OSError as e:
            last = e
            body = b""
        if body:
            # The health answer names the server: another process on the
            # port (ours failed to bind it) must not pass for it.
            try:
                name = json.loads(body).get("server")
            except (ValueError, AttributeError):
                name = None
            if name == s["name"]:
                took = time.monotonic() - start
                if took > 10:
                    print(f"launch: {s['kind']} server answered after {took:.1f}s (a busy machine?)",
                          file=sys.stderr, flush=True)
                return
            raise RuntimeError(f"{s['kind']} server: GET {s['url']}/ was answered by {name or body[:80]!r}, "
                               f"not {s['name']} (address already in use by another process); "
                               f"log {s['log']}:\n{log_tail(s['log'])}")
        time.sleep(0.05)
    raise RuntimeError(f"{s['kind']} server not answering GET {s['url']}/ after {a.startup_timeout}s "
                       f"(last error: {last}); log {s['log']}:\n{log_tail(s['log'])}")


def collector_argv(a, agent_url):
    script = os.path.join(a.stack_dir, "bin", "ng_collect_rollouts")
    if a.python == "/usr/bin/python3":
        argv = [script]  # exec the console script itself, as a Gym venv does
    else:
        argv = shlex.split(a.python) + [script]
    argv += ["--agent-url", agent_url, "--loop", a.loop]
    if a.truth:
        argv += ["--truth", a.truth]
    return argv


def run_collector(argv, log_dir, tag):
    logf = os.path.join(log_dir, f"collector-{tag}.log")
    with open(logf, "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        out, _ = proc.communicate()
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    try:
        summary = json.loads(lines[-1])
    except (IndexError, ValueError):
        summary = {"event": "summary", "error": f"collector printed no summary; log {logf}:\n{log_tail(logf)}"}
    summary["exit_code"] = proc.returncode
    summary["collector_pid"] = proc.pid
    return summary


def stop_servers(servers, timeout=30.0):
    # A bound on a failure, not a time asked of a busy machine: 30 s, as
    # the Go tests' waits. A server still alive then is asked for its
    # threads' stacks (SIGUSR2, faulthandler) and its tasks (SIGUSR1), and
    # each server dumps its threads itself 8 s after its lifespan shutdown.
    codes = {}
    for s in reversed(list(servers.values())):
        for pid in (s["pid"], s.get("shell_pid")):
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + timeout
    for s in servers.values():
        try:
            codes[s["kind"]] = s["proc"].wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # First ask it what it waits on (stacklib.dump_tasks, into its
            # log), then kill it and show that log's end.
            for sig in (signal.SIGUSR2, signal.SIGUSR1):
                try:
                    os.kill(s["pid"], sig)
                    s["proc"].wait(2)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    pass
            log(f"{s['kind']} (pid {s['pid']}) ignored SIGTERM for {timeout}s; killing it. Its log's end:\n"
                f"{log_tail(s['log'], 80)}")
            for pid in (s["pid"], s.get("shell_pid")):
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            codes[s["kind"]] = s["proc"].wait()
    return codes


def exec_ng_run(argv):
    """launch.py --exec-ng-run ...: become bin/ng_run (same pid), so a caller that
    can only run launch.py gets Gym's orchestrator name as the servers' parent."""
    script = os.path.join(HERE, "bin", "ng_run")
    i = argv.index("--exec-ng-run")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(script, [script] + argv[:i] + argv[i + 1:])


def main(argv, prog=None, description=None):
    if prog is None and "--exec-ng-run" in (argv[:argv.index("--")] if "--" in argv else argv):
        exec_ng_run(argv)
    a = parse_args(argv, prog, description)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="gymstack-")
    os.makedirs(log_dir, exist_ok=True)
    if a.ports:
        try:
            pa, pm, pr = (int(x) for x in a.ports.split(","))
        except ValueError:
            print("launch: --ports wants AGENT,MODEL,RESOURCES, three integers", file=sys.stderr)
            return EXIT_USAGE
        ports = {"agent": pa, "model": pm, "resources": pr}

    servers = {}
    rc = 0
    try:
        for attempt in range(3):
            if not a.ports:
                # Distinct: each pick's probe socket is closed at once, so
                # two picks can be the same port (one server then answered
                # for the other, whose bind failed; issue 20's twin bench).
                ports = {}
                for kind, *_ in SERVERS:
                    ports[kind] = stacklib.free_port(a.host, exclude=set(ports.values()))
            try:
                start_servers(a, ports, log_dir, servers)
                break
            except RuntimeError as e:
                # A free port found by bind(0) can be taken by someone else
                # before the server binds it: pick new ones and try again.
                if not a.ports and "address already in use" in str(e) and attempt < 2:
                    log(f"port taken during startup, retrying with new ports: {str(e).splitlines()[0]}")
                    stop_servers(servers)
                    servers.clear()
                    continue
                log(str(e))
                emit({"event": "error", "error": str(e).splitlines()[0], "log_dir": log_dir})
                return EXIT_STARTUP
        agent_url = servers["agent"]["url"]
        coll = collector_argv(a, agent_url)
        ready = {
            "event": "ready", "host": a.host, "http": a.http, "loop": a.loop, "log_dir": log_dir, "truth": a.truth,
            "launcher": prog or "launch.py", "launcher_pid": os.getpid(), "verify": verify_options(a),
            "servers": {k: {f: s[f] for f in ("name", "type", "pid", "host", "port", "url", "log")}
                        | ({"shell_pid": s["shell_pid"]} if "shell_pid" in s else {})
                        for k, s in servers.items()},
            "collector_argv": coll,
        }
        if a.gym_telemetry != "off":
            ready["gym_telemetry"] = {"exporter": a.gym_telemetry, "span_groups": a.gym_span_groups,
                                      "endpoint": a.gym_telemetry_endpoint, "flush_path": "/_gymtel/flush"}
        if a.warmup:
            w = run_collector(coll + ["--rollouts", str(a.warmup), "--concurrency", str(min(a.warmup, 4))], log_dir, "warmup")
            w.pop("rollout_ids", None)
            ready["warmup"] = w
            if w.get("exit_code") != 0:
                log(f"warmup failed: {json.dumps(w)[:500]}")
        emit(ready)
        log(" ".join(f"{k}={s['url']} pid {s['pid']}" for k, s in servers.items()) + f"; logs in {log_dir}")

        if a.wait_stdin:
            sys.stdin.readline()
        if a.rollouts is not None:
            summary = run_collector(coll + ["--rollouts", str(a.rollouts), "--concurrency", str(a.concurrency)]
                                    + a.collector_extra, log_dir, "main")
            emit(summary)
            if summary["exit_code"] != 0:
                rc = EXIT_COLLECTOR_FAILED
            if a.check_truth:
                time.sleep(0.5)  # servers flush truth every 200 ms
                check = truthcheck.check(a.truth)
                check["event"] = "truth_check"
                emit(check)
                if not check["ok"]:
                    rc = EXIT_COLLECTOR_FAILED
        if a.serve:
            while True:
                for s in servers.values():
                    if s["proc"].poll() is not None:
                        raise RuntimeError(f"{s['kind']} server exited with {s['proc'].returncode}; "
                                           f"log {s['log']}:\n{log_tail(s['log'])}")
                time.sleep(0.5)
    except Stop as sig:
        log(f"{sig}: stopping")
    except RuntimeError as e:
        log(str(e))
        rc = EXIT_STARTUP
    finally:
        # A second signal while stopping must not leave servers behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if servers:
            codes = stop_servers(servers)
            emit({"event": "stopped", "exit_codes": codes})
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
