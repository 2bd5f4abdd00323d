"""Cost loops for internal/python's measurements.

  cost_loop.py getppid N   N getppid() syscalls from inside an asyncio task
                           (the tracepoint cost programs run on each)
  cost_loop.py copy N      N calls of the exported PyContext_CopyCurrent via
                           ctypes; prints the best of 5 runs in ns per call

Prints {"pid": ...}, waits for a line on stdin, runs, prints the result as
JSON and waits for stdin to close.
"""
import asyncio
import ctypes
import json
import os
import sys
import time

mode, n = sys.argv[1], int(sys.argv[2])
print(json.dumps({"pid": os.getpid()}), flush=True)
sys.stdin.readline()

if mode == "getppid":
    async def main():
        t = time.perf_counter_ns()
        for _ in range(n):
            os.getppid()
        return (time.perf_counter_ns() - t) / n
    res = asyncio.run(main())
elif mode == "copy":
    f = ctypes.pythonapi.PyContext_CopyCurrent
    f.restype = ctypes.py_object
    f.argtypes = []
    best = None
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n):
            f()
        v = (time.perf_counter_ns() - t) / n
        best = v if best is None else min(best, v)
    res = best
else:
    raise SystemExit("unknown mode " + mode)
print(json.dumps({"ns_per_call": res}), flush=True)
sys.stdin.readline()
