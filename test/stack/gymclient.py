"""The test stack's HTTP client, as Gym's: one global keep-alive aiohttp
ClientSession per process, with a dummy cookie jar (cookies are forwarded by
hand on every hop), JSON bodies, and a retry on dropped connections; each
call is written to the ground-truth log with the socket it went out on.
"""

import asyncio
import contextvars
import json

import aiohttp

from stacklib import RETRY_SLEEP_S, addr_pair, mono_ns, now_ns

# The socket a call went out on. aiohttp releases a connection as soon as a
# small body has arrived, often before the caller sees the response, so the
# address is taken when the connector hands the connection out. connect() runs
# in the calling task, so a ContextVar set there is visible to the caller and
# to no concurrent call (each asyncio task has its own context).
_CALL_SOCKET = contextvars.ContextVar("gt_call_socket", default=None)


class TruthConnector(aiohttp.TCPConnector):
    def __init__(self, *args, split_heads=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.split_heads = split_heads

    async def connect(self, req, traces, timeout):
        conn = await super().connect(req, traces, timeout)
        transport = conn.transport
        if transport is not None:
            _CALL_SOCKET.set((addr_pair(transport.get_extra_info("sockname")),
                              addr_pair(transport.get_extra_info("peername"))))
            if self.split_heads and not hasattr(transport, "_gt_split"):  # wrapped once
                split_first_write(transport)
        return conn


# How far apart the two pieces of a split request head go out: long enough
# for the server to read the request line alone.
SPLIT_GAP_S = 0.02


def split_first_write(transport):
    """The connection's first request goes out as its request line, then,
    SPLIT_GAP_S later, the rest: a request head that reaches the server in
    two reads, as one whose sender writes it in pieces, or one that
    traceparent injection split in two TCP segments (docs/injection.md).
    Writes made meanwhile follow in order. Needs the default loop's
    transport (a Python object); uvloop's cannot be wrapped."""
    write, loop = transport.write, asyncio.get_running_loop()
    held = None  # None: nothing held back; a list: what waits for the gap

    def split_write(data):
        nonlocal held
        data = bytes(data)
        if held is not None:
            held.append(data)
            return
        if not transport._gt_split:
            transport._gt_split = True
            cut = data.find(b"\r\n") + 2
            if 1 < cut < len(data):
                write(data[:cut])
                held = [data[cut:]]
                loop.call_later(SPLIT_GAP_S, release)
                return
        write(data)

    def release():
        nonlocal held
        rest, held = held, None
        if not transport.is_closing():
            write(b"".join(rest))

    transport._gt_split = False
    transport.write = split_write
    transport.writelines = lambda parts: split_write(b"".join(bytes(p) for p in parts))


class Reply:
    __slots__ = ("status", "body", "cookies")

    def __init__(self, status, body, cookies):
        self.status = status
        self.body = body
        self.cookies = cookies


class GymClient:
    def __init__(self, truth, max_retries=20, connections="shared", split_heads=False):
        self.truth = truth
        self.split_heads = split_heads  # each connection's first request head in two writes (split_first_write)
        self.max_retries = max_retries
        self.session = None
        self.telemetry = None  # gymtel.GymTelemetry with --gym-telemetry: its CLIENT span wraps each call
        # "per-rollout": each rollout's calls get a session (a connection
        # pool) of their own, opened at its first call and closed by
        # end_rollout, so every rollout connects anew (Gym keeps one pool).
        self.per_rollout = connections == "per-rollout"
        self.rollout_sessions = {}

    def _new_session(self):
        # Gym: unbounded pool, no client timeout, cookies forwarded by hand.
        return aiohttp.ClientSession(
            connector=TruthConnector(limit=0, split_heads=self.split_heads),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def start(self):
        self.session = self._new_session()

    def session_for(self, rollout_id):
        if not self.per_rollout or rollout_id is None:
            return self.session
        s = self.rollout_sessions.get(rollout_id)
        if s is None:
            s = self.rollout_sessions[rollout_id] = self._new_session()
        return s

    async def end_rollout(self, rollout_id):
        s = self.rollout_sessions.pop(rollout_id, None)
        if s is not None:
            await s.close()

    async def close(self):
        for rid in list(self.rollout_sessions):
            await self.end_rollout(rid)
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def request(self, method, url, *, cause, json_body=None, cookies=None, stream=False, rollout_id=None,
                      headers=None):
        """One Gym hop. cause is the truth id of the inbound request whose
        handler makes this call (None for the collector)."""
        if self.telemetry is not None and headers is None:
            return await self.telemetry.client_request(self, method, url, cause=cause, json_body=json_body,
                                                       cookies=cookies, stream=stream, rollout_id=rollout_id)
        attempt = 0
        while True:
            oid = self.truth.new_outbound_id()
            t0, m0 = now_ns(), mono_ns()
            local = remote = None
            _CALL_SOCKET.set(None)
            try:
                kwargs = {"cookies": cookies or None}
                if headers:
                    kwargs["headers"] = headers
                if json_body is not None:
                    kwargs["json"] = json_body
                async with self.session_for(rollout_id).request(method, url, **kwargs) as resp:
                    local, remote = _CALL_SOCKET.get() or (None, None)
                    if stream and resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                        body = await read_sse(resp)
                    else:
                        raw = await resp.read()
                        try:
                            body = json.loads(raw) if raw else None
                        except ValueError:
                            body = {"raw": raw[:200].decode("utf-8", "replace")}
                    rcookies = {k: v.value for k, v in resp.cookies.items()}
                    status = resp.status
            except aiohttp.ClientConnectionError as e:
                local, remote = _CALL_SOCKET.get() or (None, None)
                self._emit_out(oid, cause, method, url, local, remote, None, type(e).__name__, t0, m0, attempt, rollout_id)
                attempt += 1
                if attempt > self.max_retries:
                    raise
                await asyncio.sleep(RETRY_SLEEP_S)
                continue
            self._emit_out(oid, cause, method, url, local, remote, status, None, t0, m0, attempt, rollout_id)
            return Reply(status, body, rcookies)

    def _emit_out(self, oid, cause, method, url, local, remote, status, error, t0, m0, attempt, rollout_id):
        if not self.truth.enabled:
            return
        u = aiohttp.client.URL(url)
        self.truth.emit({
            "ev": "out", "id": oid, "cause": cause, "method": method, "url": url, "path": u.path,
            "local": local, "remote": remote, "status": status, "error": error, "attempt": attempt,
            "rollout_id": rollout_id,
            "t_start": t0, "t_end": now_ns(), "mono_start": m0, "mono_end": mono_ns(),
        })

    async def post(self, url, *, cause, json_body, cookies=None, stream=False, rollout_id=None):
        return await self.request("POST", url, cause=cause, json_body=json_body, cookies=cookies,
                                  stream=stream, rollout_id=rollout_id)


async def read_sse(resp):
    """Collect an SSE stream; returns the last JSON data payload plus a count."""
    events = 0
    last = None
    async for line in resp.content:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        events += 1
        if data == b"[DONE]":
            continue
        try:
            last = json.loads(data)
        except ValueError:
            pass
    return {"stream_events": events, "final": last}
