"""HTTPS client driven line by line on stdin, for internal/tls's tests.

Commands (one per line), each answered with one line on stdout:
  import               import ssl and aiohttp now (a lazy import)      -> "imported"
  aiohttp URL N        N POSTs with aiohttp (memory BIOs), one session -> "done STATUS BYTES"
  urllib URL N         N POSTs with urllib (blocking socket BIO)       -> "done STATUS BYTES"
The CA file is argv[1]. Every request carries Authorization: Bearer TOPSECRET.
"""
import sys

CA = sys.argv[1]
HEADERS = {"Authorization": "Bearer TOPSECRET", "Content-Type": "application/json"}
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "TOPSECRET-BODY"}], "stream": true}'


def ctx():
    import ssl
    return ssl.create_default_context(cafile=CA)


async def with_aiohttp(url, n):
    import aiohttp
    status, total = 0, 0
    c = ctx()
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            async with s.post(url, data=BODY, headers=HEADERS, ssl=c) as r:
                status = r.status
                async for chunk in r.content.iter_any():
                    total += len(chunk)
    return status, total


def with_urllib(url, n):
    import urllib.request
    status, total = 0, 0
    c = ctx()
    for _ in range(n):
        req = urllib.request.Request(url, data=BODY, headers=HEADERS, method="POST")
        with urllib.request.urlopen(req, context=c) as r:
            status = r.status
            total += len(r.read())
    return status, total


print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "import":
        import ssl  # noqa: F401
        import aiohttp  # noqa: F401
        print("imported", flush=True)
    elif cmd[0] == "aiohttp":
        import asyncio
        st, n = asyncio.run(with_aiohttp(cmd[1], int(cmd[2])))
        print("done", st, n, flush=True)
    elif cmd[0] == "urllib":
        st, n = with_urllib(cmd[1], int(cmd[2]))
        print("done", st, n, flush=True)
