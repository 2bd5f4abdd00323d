"""A fake upstream LLM endpoint (vLLM, an OpenAI endpoint) for the model
server's --upstream mode (issue 40): the model server forwards each --genai
call to it, and it answers like genai.py's model server does, in the form
the request's metadata names, with the model and token counts
genai.expected() gives for the request's model (the model server asks for
"u-" + its own request's model, so the two sides' values differ).

It is not a Gym server (no Gym config, launch.py starts it apart), so
gymtrace does not trace it: only the model server's CLIENT side of these
calls is seen.

    python3 upstream.py --host 127.0.0.1 --port 9000 [--loop uvloop] [--http httptools]
"""

import argparse
import json
import os

import genai

NAME = "fake_upstream"
ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


async def _read(receive):
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path.startswith("/ng-rollout/"):
        path = "/" + path[len("/ng-rollout/"):].partition("/")[2]
    if scope["method"] == "GET" and path == "/":
        await genai.asgi_send(send, [json.dumps({"server": NAME, "pid": os.getpid()})], False, "application/json")
        return
    body = json.loads(await _read(receive) or b"{}")
    f = (body.get("metadata") or {}).get("gt_genai")
    if scope["method"] != "POST" or path not in ROUTES or not f:
        await genai.asgi_send(send, [json.dumps({"error": "not found"})], False, "application/json")
        return
    await genai.answer(f, str(body.get("model")), {"city": "Oslo"},
                       lambda pieces, chunked, media_type: genai.asgi_send(send, pieces, chunked, media_type))


def main():
    p = argparse.ArgumentParser(description="fake upstream LLM endpoint")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--http", default="h11")
    p.add_argument("--loop", default="asyncio")
    a = p.parse_args()
    import uvicorn
    uvicorn.run(app, host=a.host, port=a.port, http=a.http, loop=a.loop, log_level="warning", access_log=False,
                timeout_keep_alive=30)


if __name__ == "__main__":
    main()
