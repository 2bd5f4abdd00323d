"""Concurrent asyncio tasks that send on a socket, for internal/python's BPF test.

Prints {"pid":..., "version":...}, waits for a line on stdin (the test attaches
its BPF programs meanwhile), then runs two groups of tasks concurrently. Every
send carries its own ground truth in its first bytes:

  "X <ctx> <round>"  sent by a task created with create_task(..., context=ctx):
                     the kernel must read exactly id(ctx) as its context.
  "P <k> <round>"    sent by request task k, created (like uvicorn does) from a
                     loop callback that first read "GET /run/<k>" from a socket;
                     the test's stand-in for http.h marks that callback's
                     context as a reader, so task k must be its own root.
  "C <k> <kind>"     sent by a descendant of request task k: kind "task"
                     (create_task), "gather", "nested" (a child's child),
                     "eager" (3.12+ eager_start; "eager_later" after its
                     first await, "eager_quiet" an eager task that sends only
                     after it, "eager_chain" an eager task's eager child),
                     "soon" (call_soon callback),
                     "thread" (asyncio.to_thread: a worker thread).
                     Each must carry request k's root.
Then prints {"sent": n} and waits for stdin to close.

    ctx_sender.py [K [ROUNDS [uvloop]]]   uvloop: run on uvloop (imported first)
"""
import asyncio
import contextvars
import json
import os
import socket
import sys
import threading

K = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
UVLOOP = len(sys.argv) > 3 and sys.argv[3] == "uvloop"
if UVLOOP:
    import uvloop
out_a, out_b = socket.socketpair()
in_a, in_b = socket.socketpair()
out_a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
sent = 0
lock = threading.Lock()  # the loop and to_thread's worker both send


def send(msg):
    global sent
    with lock:
        out_a.send(msg.encode())
        sent += 1
        # Drain so the buffer never fills; the test reads the bytes in the kernel.
        try:
            while out_b.recv(1 << 16, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            pass


async def explicit(ctx_hex):
    for r in range(ROUNDS):
        send(f"X {ctx_hex} {r}")
        await asyncio.sleep(0)


async def child(k, kind):
    await asyncio.sleep(0)
    send(f"C {k} {kind}")


async def nested(k):
    await asyncio.create_task(child(k, "nested"))


async def eager_child(k):
    send(f"C {k} eager")  # before the first await: runs inside the creator's step
    await asyncio.sleep(0)
    send(f"C {k} eager_later")  # a later step of the same eager task


async def eager_quiet(k):
    await asyncio.sleep(0)
    send(f"C {k} eager_quiet")  # nothing sent in its eager step


async def eager_send(k, kind):
    send(f"C {k} {kind}")


async def eager_outer(k):
    # An eager task started by an eager task that has sent nothing yet.
    loop = asyncio.get_running_loop()
    await asyncio.Task(eager_send(k, "eager_chain"), loop=loop, eager_start=True)


async def request(k):
    loop = asyncio.get_running_loop()
    for r in range(ROUNDS):
        send(f"P {k} {r}")
        await asyncio.sleep(0)
    await asyncio.create_task(child(k, "task"))
    await asyncio.gather(child(k, "gather"), child(k, "gather"))
    await asyncio.create_task(nested(k))
    if sys.version_info >= (3, 12):
        await asyncio.Task(eager_child(k), loop=loop, eager_start=True)
        await asyncio.Task(eager_quiet(k), loop=loop, eager_start=True)
        await asyncio.Task(eager_outer(k), loop=loop, eager_start=True)
    fut = loop.create_future()
    loop.call_soon(lambda: (send(f"C {k} soon"), fut.set_result(None)))
    await fut
    await asyncio.to_thread(send, f"C {k} thread")


async def main():
    loop = asyncio.get_running_loop()
    tasks = []
    for _ in range(K):
        ctx = contextvars.copy_context()
        tasks.append(loop.create_task(explicit(hex(id(ctx))), context=ctx))

    made = loop.create_future()

    def reader(k):
        # Like a protocol's data_received: read the request, start its task.
        in_b.sendall(f"GET /run/{k} HTTP/1.1\r\n\r\n".encode())
        in_a.recv(1 << 16)
        tasks.append(loop.create_task(request(k)))
        if k == K - 1:
            made.set_result(None)

    for k in range(K):
        loop.call_soon(reader, k)
    await made
    await asyncio.gather(*tasks)


print(json.dumps({"pid": os.getpid(), "version": sys.version.split()[0]}), flush=True)
sys.stdin.readline()
if UVLOOP:
    uvloop.run(main())
else:
    asyncio.run(main())
print(json.dumps({"sent": sent}), flush=True)
sys.stdin.readline()
