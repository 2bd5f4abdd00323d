"""Eager tasks quiet in their eager steps, for TestKernelEagerSerial.

Prints {"pid", "version"} and waits for a line ("go": the probes are on).
Then, for each of the tasks "A", "B" and "C", started eagerly one after the
other on uvloop: from its eager step it prints {"task": id(task), "ctx":
id(its context)} and waits for a line (the test plants a link at that
context meanwhile); after its first await it sends "S <name>" on a socket
pair (sendto, which the test's program records). Then it prints
{"sent": 3} and waits for stdin to close.
"""
import asyncio
import json
import os
import socket
import sys

import uvloop

out_a, out_b = socket.socketpair()


def say(obj):
    print(json.dumps(obj), flush=True)


async def quiet(name):
    task = asyncio.current_task()
    say({"task": id(task), "ctx": id(task.get_context())})
    sys.stdin.readline()  # no traced call in the eager step
    await asyncio.sleep(0)
    out_a.send(f"S {name}".encode())
    out_b.recv(64)


async def main():
    loop = asyncio.get_running_loop()
    for name in ("A", "B", "C"):
        await asyncio.Task(quiet(name), loop=loop, eager_start=True)
    say({"sent": 3})
    sys.stdin.read()


say({"pid": os.getpid(), "version": sys.version.split()[0]})
sys.stdin.readline()
uvloop.run(main())
