"""A Gym-shaped model server for test/tls (FastAPI + uvicorn, as Gym's
servers are): POST /v1/responses calls an OpenAI-compatible upstream with
aiohttp, as Gym's server_utils.request does (memory-BIO TLS under asyncio for
an https:// upstream), reads its streamed (SSE) answer to the end, and
replies with JSON.

argv: PORT UPSTREAM_URL CA_FILE. Prints "listening" once serving.
The upstream call carries Authorization: Bearer TOPSECRET; gymtrace must never
export it.
"""
import ssl
import sys

import aiohttp
import uvicorn
from fastapi import FastAPI, Request

PORT, UPSTREAM, CA = int(sys.argv[1]), sys.argv[2], sys.argv[3]
HEADERS = {"Authorization": "Bearer TOPSECRET", "Content-Type": "application/json"}
BODY = b'{"model": "m", "stream": true, "messages": [{"content": "TOPSECRET-BODY"}]}'

app = FastAPI()
state = {}


@app.on_event("startup")
async def startup() -> None:
    state["ssl"] = ssl.create_default_context(cafile=CA)
    state["session"] = aiohttp.ClientSession()
    print("listening", flush=True)


@app.post("/v1/responses")
async def responses(request: Request) -> dict:
    await request.body()
    parts = 0
    async with state["session"].post(UPSTREAM, data=BODY, headers=HEADERS, ssl=state["ssl"]) as r:
        async for line in r.content:
            if line.startswith(b"data:"):
                parts += 1
        status = r.status
    return {"upstream_status": status, "parts": parts}


uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False, loop="asyncio")
