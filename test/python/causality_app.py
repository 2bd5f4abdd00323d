"""A small FastAPI + aiohttp stack for testing in-process causality.

Three roles, one per process:
  upstream  a raw asyncio HTTP/1.1 server that answers every request with 200
  app       FastAPI on uvicorn; /run/{rid} makes outbound aiohttp calls to the
            upstream from the handler task itself, from asyncio.gather children,
            from a create_task child and (POST) from aiohttp's body-writer task.
            The outbound paths are /up/{rid}/{how}, and the response carries
            "x-rid: {rid}", so a test can tell from the bytes alone which inbound
            request each syscall belongs to (ground truth for the tests only).
  load      sends N requests to the app at a given concurrency and exits.

Runs on Debian's /usr/bin/python3 (3.11) and on python3.13 in the trixie root.
"""
import argparse
import asyncio
import os
import sys


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["upstream", "app", "load"])
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--upstream-port", type=int, default=18081)
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    p.add_argument("--http", default="h11", choices=["h11", "httptools"])
    p.add_argument("--middleware", action="store_true",
                   help="wrap the app in a Starlette BaseHTTPMiddleware (anyio task group)")
    p.add_argument("--shape", default="full", choices=["full", "direct", "none"],
                   help="full: direct+gather+task+post; direct: one GET; none: no outbound call")
    p.add_argument("-n", type=int, default=100)
    p.add_argument("-c", type=int, default=8)
    return p.parse_args()


class Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            self.t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")


async def upstream(args):
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(Upstream, "127.0.0.1", args.upstream_port)
    print("upstream ready", flush=True)
    async with srv:
        await srv.serve_forever()


def app(args):
    import aiohttp
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    api = FastAPI()
    base = f"http://127.0.0.1:{args.upstream_port}"
    state = {}

    async def session():
        if "s" not in state:
            state["s"] = aiohttp.ClientSession()
        return state["s"]

    async def get(path):
        s = await session()
        async with s.get(base + path) as r:
            await r.read()

    async def post(path):
        s = await session()
        # A body makes aiohttp write it from its own write_bytes task.
        async with s.post(base + path, data=b"y" * 200) as r:
            await r.read()

    async def nested(rid):
        await asyncio.gather(get(f"/up/{rid}/nested1"), get(f"/up/{rid}/nested2"))

    @api.get("/run/{rid}")
    async def run(rid: str):
        if args.shape in ("full", "direct"):
            await get(f"/up/{rid}/direct")
        if args.shape == "full":
            await asyncio.gather(get(f"/up/{rid}/g1"), get(f"/up/{rid}/g2"))
            await asyncio.create_task(get(f"/up/{rid}/task"))
            await asyncio.create_task(nested(rid))
            await post(f"/up/{rid}/post")
        return JSONResponse({"rid": rid}, headers={"x-rid": rid})

    if args.middleware:
        from starlette.middleware.base import BaseHTTPMiddleware

        async def passthrough(request, call_next):
            return await call_next(request)

        api.add_middleware(BaseHTTPMiddleware, dispatch=passthrough)

    print(f"app pid {os.getpid()} python {sys.version.split()[0]}", flush=True)
    # Gym's keep-alive timeout (30 s, as test/stack/stacklib.py's servers),
    # not uvicorn's 5 s: Debian 12's uvicorn 0.17 arms that timer when a
    # response completes even if it then starts a request that arrived
    # meanwhile (BaseHTTPMiddleware's responses finish after the client has
    # them all and sent its next request), and closes the connection under
    # that request if it runs longer: ServerDisconnected in the load, once in
    # CI, with two QEMU guests slowing requests on the same two cores.
    uvicorn.run(api, host="127.0.0.1", port=args.port, loop=args.loop, http=args.http,
                log_level="warning", access_log=False, timeout_keep_alive=30)


async def load(args):
    import aiohttp

    sem = asyncio.Semaphore(args.c)
    errors = 0

    async def one(i, s):
        nonlocal errors
        async with sem:
            async with s.get(f"http://127.0.0.1:{args.port}/run/r{i}") as r:
                await r.read()
                if r.status != 200 or r.headers.get("x-rid") != f"r{i}":
                    errors += 1

    conn = aiohttp.TCPConnector(limit=args.c)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(*(one(i, s) for i in range(args.n)))
    print(f"load done n={args.n} errors={errors}", flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    a = parse()
    if a.role == "upstream":
        asyncio.run(upstream(a))
    elif a.role == "app":
        app(a)
    else:
        asyncio.run(load(a))
