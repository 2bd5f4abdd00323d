"""Gym-shaped model server (responses_api_models): policy_model.

Routes: POST /v1/chat/completions, /v1/responses, /v1/messages, GET / (health).
A leading /ng-rollout/<id> is stripped, as in Gym. With "stream": true in the
body the answer is an SSE stream (chunked transfer encoding) of several events
with small sleeps between them, like an upstream LLM.

Test knobs in the request's "metadata": {"gt_fail": 500} answers that status.

With --upstream URL (launch.py --model-upstream), each --genai call is first
forwarded to that fake upstream LLM endpoint (upstream.py), as a Gym model
server calls vLLM or OpenAI: the same body and route with "u-" before the
model (every odd turn's under /ng-rollout/<id>), the answer read whole, then
the call answered as without it (issue 40: the upstream CLIENT exchange gets
its own GenAI values and adds nothing to the rollout).
"""

import asyncio
import json
import os
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.middleware.sessions import SessionMiddleware

import genai
import gymclient
import stacklib

CLASS_NAME = "SimpleModelServer"
CITIES = ["Paris", "Lagos", "Lima", "Osaka", "Oslo", "Quito", "Perth"]


def pick_city(body):
    text = json.dumps(body.get("input") or body.get("messages") or "", sort_keys=True)
    return CITIES[sum(text.encode()) % len(CITIES)]


def tool_args(body):
    return {"city": pick_city(body)}


def responses_payload(body):
    call_id = "call_" + uuid.uuid4().hex[:12]
    return {
        "id": "resp_" + uuid.uuid4().hex[:16], "object": "response", "model": body.get("model", "policy"),
        "status": "completed",
        "output": [{"type": "function_call", "call_id": call_id, "name": "get_weather",
                    "arguments": json.dumps(tool_args(body))}],
        "usage": {"input_tokens": 42, "output_tokens": 7},
    }


def chat_payload(body):
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:16], "object": "chat.completion", "model": body.get("model", "policy"),
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_" + uuid.uuid4().hex[:12], "type": "function",
                            "function": {"name": "get_weather", "arguments": json.dumps(tool_args(body))}}]}}],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7},
    }


def messages_payload(body):
    return {
        "id": "msg_" + uuid.uuid4().hex[:16], "type": "message", "role": "assistant",
        "model": body.get("model", "policy"), "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:12], "name": "get_weather",
                     "input": tool_args(body)}],
        "usage": {"input_tokens": 42, "output_tokens": 7},
    }


class GenAIResponse(Response):
    """An answer with known models and token counts in the form the request
    asks for (genai.py)."""

    def __init__(self, f, req_model, tool_args):
        super().__init__()
        self.f, self.req_model, self.tool_args = f, req_model, tool_args

    async def __call__(self, scope, receive, send):
        await genai.answer(self.f, self.req_model, self.tool_args,
                           lambda pieces, chunked, media_type: genai.asgi_send(send, pieces, chunked, media_type))


def sse(event, data):
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()


async def stream_events(kind, payload, chunks, gap_s):
    # A few deltas, then the full object, then the terminator: every event is
    # its own chunk on the wire, with a pause so they cross separate syscalls.
    for i in range(chunks):
        if kind == "chat":
            yield sse(None, {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
        elif kind == "messages":
            yield sse("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": f"t{i} "}})
        else:
            yield sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": f"t{i} "})
        await asyncio.sleep(gap_s)
    if kind == "chat":
        yield sse(None, payload)
        yield sse(None, "[DONE]")
    elif kind == "messages":
        yield sse("message_stop", payload)
    else:
        yield sse("response.completed", {"type": "response.completed", "response": payload})


ROUTE_OF = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


async def call_upstream(client, upstream, request, kind, body, gf):
    model = str(body.get("model"))
    fwd = dict(body)  # the same key order: "model" after the conversation
    fwd["model"] = "u-" + model
    prefix = "/ng-rollout/" + model.rsplit("-t", 1)[0] if model[-1:] in "13579" else ""
    r = await client.post(upstream + prefix + ROUTE_OF[kind], cause=request.scope.get("gt_inbound"), json_body=fwd,
                          stream=bool(gf.get("stream")))
    if r.status != 200:
        raise RuntimeError(f"upstream answered {r.status}")


def build_app(cfg, truth, client, latency_s, chunks, chunk_gap_s, upstream=None):
    app = FastAPI()
    app.add_middleware(SessionMiddleware, secret_key="gymtrace-test",
                       session_cookie=stacklib.session_cookie_name(CLASS_NAME, cfg.name))
    app.add_middleware(stacklib.StripRolloutPrefix)
    app.add_middleware(stacklib.TruthMiddleware, truth=truth)
    stacklib.install_lifecycle(app, cfg, truth, client, cfg.args)

    async def answer(request, kind, build):
        body = await request.json()
        await asyncio.sleep(latency_s)
        fail = (body.get("metadata") or {}).get("gt_fail")
        if fail:
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error"}}, status_code=int(fail))
        gf = (body.get("metadata") or {}).get("gt_genai")
        if gf:
            if upstream:
                await call_upstream(client, upstream, request, kind, body, gf)
            return GenAIResponse(gf, str(body.get("model")), tool_args(body))
        payload = build(body)
        pad = int((body.get("metadata") or {}).get("gt_pad_kib", 0))
        if pad:
            payload["gt_pad"] = "y" * (pad * 1024)  # a long answer: the response is large too
        if body.get("stream"):
            n = int((body.get("metadata") or {}).get("gt_stream_chunks", chunks))
            return StreamingResponse(stream_events(kind, payload, n, chunk_gap_s), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return payload

    @app.get("/")
    async def health():
        return {"server": cfg.name, "type": cfg.type, "pid": os.getpid()}

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await answer(request, "responses", responses_payload)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, "chat", chat_payload)

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await answer(request, "messages", messages_payload)

    return app


def main():
    p = stacklib.server_arg_parser("model")
    p.add_argument("--latency-ms", type=float, default=5.0, help="sleep per model call (default 5)")
    p.add_argument("--stream-chunks", type=int, default=5, help="delta events per streamed answer (default 5)")
    p.add_argument("--chunk-gap-ms", type=float, default=2.0, help="sleep between streamed events (default 2)")
    p.add_argument("--upstream", help="forward each --genai call to this fake upstream LLM first (upstream.py)")
    args = p.parse_args()
    cfg = stacklib.load_server_config("model", args)
    cfg.args = args
    truth = stacklib.Truth(args.truth, cfg.name, cfg.type)
    client = gymclient.GymClient(truth)
    app = build_app(cfg, truth, client, args.latency_ms / 1000, args.stream_chunks, args.chunk_gap_ms / 1000,
                    args.upstream)
    stacklib.serve(app, cfg, args, client)


if __name__ == "__main__":
    main()
