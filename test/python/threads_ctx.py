"""Holds a CPython process in a known state for internal/python's tests.

Starts N extra threads (each enters its own contextvars.Context and blocks),
and an asyncio loop on the main thread, then prints one JSON line:
{"version": ..., "main": native_id, "threads": {native_id: context_id_hex}}
and waits
until stdin closes. context ids are id() of the Context each thread is
running in, which is the PyContext address the kernel must find.
"""
import asyncio
import contextvars
import json
import sys
import threading

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ready = threading.Barrier(N + 1)
stop = threading.Event()
seen = {}
lock = threading.Lock()


def worker():
    ctx = contextvars.Context()

    def inside():
        with lock:
            seen[threading.get_native_id()] = hex(id(ctx))
        ready.wait()
        stop.wait()

    ctx.run(inside)


async def main():
    ts = [threading.Thread(target=worker, daemon=True) for _ in range(N)]
    for t in ts:
        t.start()
    ready.wait()
    print(json.dumps({"version": sys.version.split()[0], "main": threading.get_native_id(),
                      "threads": seen}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    stop.set()


asyncio.run(main())
