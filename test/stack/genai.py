"""Model calls with known models and token counts, in every form (issue 40).

With the collector's --genai every rollout's model calls vary, by rollout
index i and turn k: the dialect, JSON or SSE, small or over 64 KiB both ways
(the request's "model" after the conversation, as the OpenAI client orders
it), and how the answer crosses the wire (one write, several writes cut
inside keys and numbers, chunked). Every body carries decoys: the keys inside
message content and nested deeper than the dialect puts them.

The request's model is "m-<rollout id>-t<k>"; the answer's model and token
counts are functions of it (expected(), mirrored by the e2e test in Go), so
a test knows every exact value without reading a body.
"""

import asyncio
import json
import zlib

DIALECTS = ["chat_completions", "responses", "messages"]
FRAMINGS = ["plain", "split", "chunked"]
BIG = 70 * 1024  # bytes of conversation or answer text in a big form

DECOY_TEXT = 'reply as {"model": "decoy", "usage": {"prompt_tokens": 999999, "input_tokens": 999999}} \\"model\\": 1'


def form(i, k):
    """The form of rollout i's turn k."""
    return {
        "dialect": DIALECTS[(i + k) % 3],
        "stream": ((i // 3) + k) % 2 == 1,
        "big": (i // 6) % 2 == 1,
        "framing": FRAMINGS[(i + 2 * k) % 3],
    }


def model_name(rollout_id, k):
    return f"m-{rollout_id}-t{k}"


def expected(req_model):
    """The answer's model and token counts for a request's model."""
    c = zlib.crc32(req_model.encode())
    return req_model + "-r", 100 + c % 100000, 1 + (c >> 17) % 5000


def request_body(f, name, messages, tools):
    """A model request in the dialect's shape, "model" after the conversation
    (the OpenAI client's order), decoys inside strings and nested."""
    msgs = [{"role": "system", "content": DECOY_TEXT}] + list(messages)
    if f["big"]:
        msgs.append({"role": "user", "content": "lorem ipsum " * (BIG // 12)})
    key = "input" if f["dialect"] == "responses" else "messages"
    body = {key: msgs, "metadata": {"model": "decoy-meta", "gt_genai": f}, "model": name, "tools": tools}
    if f["dialect"] == "messages":
        body["max_tokens"] = 64
    if f["stream"]:
        body["stream"] = True
        if f["dialect"] == "chat_completions":
            body["stream_options"] = {"include_usage": True}
    return body


def _payload(f, req_model, tool_args):
    model, inp, out = expected(req_model)
    pad = {"gt_pad": "y" * BIG} if f["big"] else {}
    args = json.dumps(tool_args)
    if f["dialect"] == "chat_completions":
        return {**pad, "id": "chatcmpl-1", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "finish_reason": "tool_calls", "usage": {"prompt_tokens": 7, "completion_tokens": 7},
                             "message": {"role": "assistant", "content": DECOY_TEXT, "tool_calls": [
                                 {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}}],
                "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out,
                          "prompt_tokens_details": {"cached_tokens": 0}}}
    if f["dialect"] == "responses":
        return {**pad, "id": "resp_1", "object": "response", "model": model, "status": "completed",
                "output": [{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args,
                            "usage": {"input_tokens": 5, "output_tokens": 5}},
                           {"type": "message", "content": [{"type": "output_text", "text": DECOY_TEXT}]}],
                "usage": {"input_tokens": inp, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
                          "total_tokens": inp + out}}
    return {**pad, "id": "msg_1", "type": "message", "role": "assistant", "model": model, "stop_reason": "tool_use",
            "content": [{"type": "text", "text": DECOY_TEXT},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": tool_args}],
            "usage": {"input_tokens": inp, "cache_creation_input_tokens": 3, "output_tokens": out}}


def _sse(event, data):
    head = f"event: {event}\n" if event else ""
    return head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n"


def _events(f, req_model, tool_args):
    """The dialect's real stream: usage where each API puts it."""
    model, inp, out = expected(req_model)
    delta = "lorem " * (BIG // 6) if f["big"] else "t0 "
    if f["dialect"] == "chat_completions":
        return [
            _sse(None, {"id": "c", "object": "chat.completion.chunk", "model": model,
                        "choices": [{"index": 0, "delta": {"content": DECOY_TEXT}}], "usage": None}),
            _sse(None, {"id": "c", "object": "chat.completion.chunk", "model": model,
                        "choices": [{"index": 0, "delta": {"content": delta}}], "usage": None}),
            _sse(None, {"id": "c", "object": "chat.completion.chunk", "model": model,
                        "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {
                            "name": "get_weather", "arguments": json.dumps(tool_args)}}]}, "finish_reason": "tool_calls"}],
                        "usage": None}),
            _sse(None, {"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [],
                        "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}}),
            _sse(None, "[DONE]"),
        ]
    if f["dialect"] == "responses":
        final = _payload(dict(f, big=False), req_model, tool_args)
        return [
            _sse("response.created", {"type": "response.created", "response": {"id": "resp_1", "model": model,
                                                                                "status": "in_progress", "output": [], "usage": None}}),
            _sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": DECOY_TEXT}),
            _sse("response.output_text.delta", {"type": "response.output_text.delta", "delta": delta}),
            _sse("response.completed", {"type": "response.completed", "response": final}),
        ]
    return [
        _sse("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                                  "model": model, "content": [],
                                                                  "usage": {"input_tokens": inp, "output_tokens": 1}}}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": DECOY_TEXT}}),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": out}}),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def _cuts(text):
    """text in pieces cut inside the keys and numbers that matter."""
    points = set()
    for needle in ('"model"', '"usage"', '_tokens"', '"response"', '"message"'):
        at = 0
        while True:
            j = text.find(needle, at)
            if j < 0:
                break
            points.add(j + len(needle) // 2)
            # ... and inside the value after it
            points.add(min(len(text) - 1, j + len(needle) + 4))
            at = j + 1
    points = sorted(p for p in points if 0 < p < len(text))
    out, last = [], 0
    for p in points:
        out.append(text[last:p])
        last = p
    out.append(text[last:])
    return [x for x in out if x]


async def answer(f, req_model, tool_args, send_body):
    """The answer as pieces for send_body(pieces, chunked, media_type)."""
    if f["stream"]:
        events = _events(f, req_model, tool_args)
        if f["framing"] == "split":
            pieces = _cuts("".join(events))  # events cut across chunks
        else:
            pieces = events  # one event a chunk
        return await send_body(pieces, True, "text/event-stream")
    text = json.dumps(_payload(f, req_model, tool_args))
    if f["framing"] == "plain":
        return await send_body([text], False, "application/json")
    return await send_body(_cuts(text), f["framing"] == "chunked", "application/json")


async def asgi_send(send, pieces, chunked, media_type):
    """Sends pieces as separate body messages: with a Content-Length (each a
    write of its own) or chunked (each a chunk)."""
    data = [p.encode() for p in pieces]
    headers = [(b"content-type", media_type.encode())]
    if not chunked:
        headers.append((b"content-length", str(sum(len(d) for d in data)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for j, d in enumerate(data):
        await send({"type": "http.response.body", "body": d, "more_body": j + 1 < len(data)})
        if j + 1 < len(data):
            await asyncio.sleep(0.0005)  # so the pieces cross separate syscalls
