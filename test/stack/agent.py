"""Gym-shaped agent server (responses_api_agents): simple_weather_simple_agent.

POST /run does what Gym's simple agent does for one rollout:
  1. resources POST /seed_session
  2. its own POST /v1/responses over HTTP (or /ng-rollout/<id>/v1/responses),
     which loops K turns of model POST /v1/responses (or chat/completions or
     messages) then tool POST /get_weather on resources
  3. resources POST /verify, here in parallel (asyncio.gather) with one more
     tool call, so calls made from child tasks are covered.
The /v1/responses routes run behind a Starlette BaseHTTPMiddleware, whose
call_next runs the endpoint in an anyio task-group child task.

Test knobs ride in the /run row under "gt" (see README.md).
"""

import asyncio
import json
import os
import time

from fastapi import FastAPI, HTTPException, Request
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.sessions import SessionMiddleware

import genai
import gymclient
import stacklib

CLASS_NAME = "SimpleAgent"
MODEL_ROUTES = {
    "responses": "/v1/responses",
    "chat_completions": "/v1/chat/completions",
    "messages": "/v1/messages",
}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


class RouteSplit:
    """Sends matching paths through a BaseHTTPMiddleware, the rest straight on."""

    def __init__(self, app, predicate, dispatch):
        self.app = app
        self.wrapped = BaseHTTPMiddleware(app, dispatch=dispatch)
        self.predicate = predicate

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.predicate(scope["path"]):
            await self.wrapped(scope, receive, send)
        else:
            await self.app(scope, receive, send)


async def timing_dispatch(request, call_next):
    t0 = time.perf_counter()
    response = await call_next(request)
    response.headers["x-agent-elapsed-ms"] = f"{(time.perf_counter() - t0) * 1000:.1f}"
    return response


def model_body(route, messages, stream, metadata):
    if route == "responses":
        body = {"model": "policy", "input": messages, "tools": TOOLS}
    elif route == "chat_completions":
        body = {"model": "policy", "messages": messages,
                "tools": [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]}
    else:
        body = {"model": "policy", "messages": messages, "max_tokens": 64,
                "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["parameters"]}]}
    if stream:
        body["stream"] = True
    if metadata:
        body["metadata"] = metadata
    return body


def tool_call_args(route, body):
    """The get_weather arguments from any of the three answer shapes, streamed or not."""
    try:
        if isinstance(body, dict) and "stream_events" in body:
            body = body["final"] or {}
            if body.get("type") == "response.completed":
                body = body["response"]
        if route == "responses":
            return json.loads(body["output"][0]["arguments"])
        if route == "chat_completions":
            return json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
        return dict(body["content"][0]["input"])
    except (KeyError, IndexError, TypeError, ValueError):
        return {"city": "Paris"}


def build_app(cfg, truth, client, base_middleware):
    app = FastAPI()
    app.add_middleware(SessionMiddleware, secret_key="gymtrace-test",
                       session_cookie=stacklib.session_cookie_name(CLASS_NAME, cfg.name))
    if base_middleware != "none":
        predicate = (lambda path: True) if base_middleware == "all" else (lambda path: path.endswith("/v1/responses"))
        app.add_middleware(RouteSplit, predicate=predicate, dispatch=timing_dispatch)
    app.add_middleware(stacklib.TruthMiddleware, truth=truth)
    stacklib.install_lifecycle(app, cfg, truth, client, cfg.args)

    self_url = f"http://{stacklib.host_for_url(cfg.host)}:{cfg.port}"
    resources_url = cfg.url_of(cfg.fields["resources_server"])
    model_url = cfg.url_of(cfg.fields["model_server"])

    def expect_ok(reply, what):
        if reply.status >= 400:
            # Gym's agent does not catch a failed hop: the rollout fails with a 500.
            raise HTTPException(500, f"{what} answered {reply.status}")

    @app.get("/")
    async def health():
        return {"server": cfg.name, "type": cfg.type, "pid": os.getpid()}

    @app.post("/run")
    async def run(request: Request):
        row = await request.json()
        cause = request.scope["gt_inbound"]
        knobs = row.get("gt") or {}
        rollout_id = stacklib.gym_rollout_id(row)
        request.scope["gt_rollout_id"] = rollout_id
        try:
            return await run_rollout(request, row, cause, knobs, rollout_id)
        finally:
            # --connections per-rollout: this rollout's pool closes with it.
            await client.end_rollout(rollout_id)

    async def run_rollout(request, row, cause, knobs, rollout_id):
        prefix = f"/ng-rollout/{rollout_id}" if knobs.get("prefix") and rollout_id else ""
        turns = int(knobs.get("turns", 2))
        cookies = dict(request.cookies)
        await asyncio.sleep(0.001)

        seed = await client.post(resources_url + prefix + "/seed_session", cause=cause, rollout_id=rollout_id,
                                 cookies=cookies, json_body={"expected_tool_calls": turns})
        expect_ok(seed, "resources /seed_session")
        cookies.update(seed.cookies)
        request.session["rollout_id"] = rollout_id

        params = dict(row.get("responses_create_params") or {})
        params["gt"] = knobs
        params["gt_rollout_id"] = rollout_id
        resp = await client.post(self_url + prefix + "/v1/responses", cause=cause, rollout_id=rollout_id,
                                 cookies=cookies, json_body=params)
        expect_ok(resp, "agent /v1/responses")
        cookies.update(resp.cookies)

        verify, extra = await asyncio.gather(
            client.post(resources_url + prefix + "/verify", cause=cause, rollout_id=rollout_id, cookies=cookies,
                        json_body={"response": resp.body, "verify_sandbox": knobs.get("verify_sandbox")}),
            client.post(resources_url + prefix + "/get_weather", cause=cause, rollout_id=rollout_id, cookies=cookies,
                        json_body={"city": "Reykjavik"}),
        )
        expect_ok(verify, "resources /verify")
        expect_ok(extra, "resources /get_weather")
        return {"rollout_id": rollout_id, "reward": verify.body.get("reward"), "response": resp.body,
                "verify": verify.body}

    async def responses(request: Request, rollout_id=None):
        body = await request.json()
        cause = request.scope["gt_inbound"]
        knobs = body.get("gt") or {}
        if rollout_id is not None:
            request.scope["gt_rollout_id"] = rollout_id
        else:
            rollout_id = body.get("gt_rollout_id")
        prefix = f"/ng-rollout/{rollout_id}" if knobs.get("prefix") and rollout_id else ""
        cookies = dict(request.cookies)
        turns = int(knobs.get("turns", 2))
        route_knob = knobs.get("model_route", "responses")
        sandbox = knobs.get("sandbox")
        sandbox_name = f"gt-{rollout_id or 'x'}"
        messages = list(body.get("input") or [{"role": "user", "content": "What is the weather?"}])
        calls = []

        if sandbox:
            r = await client.post(resources_url + prefix + "/run_sandbox", cause=cause, rollout_id=rollout_id, cookies=cookies,
                                  json_body={"provider": sandbox, "verb": "start", "name": sandbox_name})
            expect_ok(r, "resources /run_sandbox")
        for k in range(turns):
            await asyncio.sleep(0.001)
            route = list(MODEL_ROUTES)[k % 3] if route_knob == "cycle" else route_knob
            metadata = {"gt_fail": knobs["fail"]} if knobs.get("fail") and k == 0 else None
            if knobs.get("body_kib"):
                metadata = dict(metadata or {}, gt_pad_kib=int(knobs["body_kib"]))
            body, stream = model_body(route, messages, knobs.get("stream"), metadata), bool(knobs.get("stream"))
            if knobs.get("genai") is not None:
                # Known models and token counts in every form (genai.py).
                f = genai.form(int(knobs["genai"]), k)
                route, stream = f["dialect"], f["stream"]
                body = genai.request_body(f, genai.model_name(rollout_id, k), messages,
                                          model_body(route, [], False, None)["tools"])
            m = await client.post(model_url + prefix + MODEL_ROUTES[route], cause=cause, rollout_id=rollout_id, cookies=cookies,
                                  json_body=body, stream=stream)
            expect_ok(m, f"model {MODEL_ROUTES[route]}")
            args = tool_call_args(route, m.body)
            t = await client.post(resources_url + prefix + "/get_weather", cause=cause, rollout_id=rollout_id, cookies=cookies,
                                  json_body=args)
            expect_ok(t, "resources /get_weather")
            calls.append({"route": route, "tool": t.body})
            messages.append({"role": "tool", "content": json.dumps(t.body)})
            if sandbox:
                r = await client.post(resources_url + prefix + "/run_sandbox", cause=cause, rollout_id=rollout_id, cookies=cookies,
                                      json_body={"provider": sandbox, "verb": "exec", "name": sandbox_name,
                                                 "cmd": f"exit {int(knobs.get('sandbox_rc', 0))}"})
                expect_ok(r, "resources /run_sandbox")
                calls[-1]["sandbox_rc"] = r.body.get("return_code")
        out = {"object": "response", "status": "completed", "turns": calls}
        if knobs.get("body_kib"):
            out["output_text"] = "z" * (int(knobs["body_kib"]) * 1024)
        return out

    @app.post("/v1/responses")
    async def v1_responses(request: Request):
        return await responses(request)

    @app.post("/ng-rollout/{rollout_id}/v1/responses")
    async def ng_rollout_responses(rollout_id: str, request: Request):
        return await responses(request, rollout_id)

    @app.post("/ng-rollout/{rollout_id}/training-token-capture/v1/responses")
    async def ng_rollout_ttc_responses(rollout_id: str, request: Request):
        return await responses(request, rollout_id)

    @app.post("/aggregate_metrics")
    async def aggregate_metrics(request: Request):
        body = await request.json()
        r = await client.post(resources_url + "/aggregate_metrics", cause=request.scope["gt_inbound"],
                              json_body=body)
        expect_ok(r, "resources /aggregate_metrics")
        return {"agent": cfg.name, "resources": r.body}

    return app


def main():
    p = stacklib.server_arg_parser("agent")
    p.add_argument("--base-middleware", choices=["responses", "all", "none"], default="responses",
                   help="which routes run behind a BaseHTTPMiddleware (anyio task group); default the /v1/responses routes")
    args = p.parse_args()
    cfg = stacklib.load_server_config("agent", args)
    cfg.args = args
    for ref in ("resources_server", "model_server"):
        if ref not in cfg.fields:
            raise SystemExit(f"config error: agent {cfg.name!r} has no {ref} reference "
                             "({type: ..., name: ...}) in NEMO_GYM_CONFIG_DICT, or --peers without config")
    truth = stacklib.Truth(args.truth, cfg.name, cfg.type)
    client = gymclient.GymClient(truth, connections=args.connections)
    stacklib.serve(build_app(cfg, truth, client, args.base_middleware), cfg, args, client)


if __name__ == "__main__":
    main()
