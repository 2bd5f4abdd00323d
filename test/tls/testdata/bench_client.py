"""HTTPS load for test/tls's benchmark: on each stdin line "N", make N
sequential POSTs over one keep-alive aiohttp session and print requests/s.
argv: URL CA_FILE."""
import asyncio
import ssl
import sys
import time

import aiohttp

URL, CA = sys.argv[1], sys.argv[2]
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
HEADERS = {"Authorization": "Bearer TOPSECRET", "Content-Type": "application/json"}


async def run(session, ctx, n):
    t = time.perf_counter()
    for _ in range(n):
        async with session.post(URL, data=BODY, headers=HEADERS, ssl=ctx) as r:
            await r.read()
    return n / (time.perf_counter() - t)


async def main():
    ctx = ssl.create_default_context(cafile=CA)
    async with aiohttp.ClientSession() as s:
        await run(s, ctx, 20)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            print(f"{await run(s, ctx, int(line)):.1f}", flush=True)


asyncio.run(main())
