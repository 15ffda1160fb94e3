"""The OpenAI chat completions wire format: a request read into the neutral
ModelRequest, a ModelReply written as a completion or as its stream."""

from __future__ import annotations

import json
import time

from . import fields
from .errors import BadRequest, GatewayError
from .messages import (Api, Message, ModelReply, ModelRequest, Role, Stop, ToolCall, ToolSpec,
                       Usage)

FINISH = {Stop.END: "stop", Stop.TOOL_USE: "tool_calls", Stop.MAX_TOKENS: "length"}


def parse(body: dict) -> ModelRequest:
    model = fields.name(body.get("model"), "model")
    raw = fields.items(body.get("messages"), "messages", fields.MAX_MESSAGES)
    system, messages = [], []
    for i, m in enumerate(raw):
        m = fields.obj(m, f"messages[{i}]")
        role = m.get("role")
        where = f"messages[{i}]"
        if role in ("system", "developer"):
            system.append(fields.blocks_text(m.get("content"), f"{where}.content"))
        elif role == "user":
            messages.append(Message(Role.USER, fields.blocks_text(m.get("content"),
                                                                  f"{where}.content")))
        elif role == "assistant":
            messages.append(_assistant(m, where))
        elif role == "tool":
            messages.append(Message(Role.TOOL, fields.blocks_text(m.get("content"),
                                                                  f"{where}.content"),
                                    tool_call_id=fields.text(m.get("tool_call_id"),
                                                             f"{where}.tool_call_id",
                                                             limit=fields.MAX_ID)))
        else:
            raise BadRequest(f"{where}.role must be system, developer, user, assistant or tool")
    options = fields.obj(body.get("stream_options"), "stream_options", optional=True)
    return ModelRequest(
        Api.OPENAI, model, "\n\n".join(system), tuple(messages), _tools(body.get("tools")),
        stream=fields.flag(body.get("stream"), "stream"),
        max_tokens=fields.count(body.get("max_completion_tokens", body.get("max_tokens")),
                                "max_tokens"),
        stream_usage=fields.flag(options.get("include_usage"), "stream_options.include_usage"))


def _assistant(m: dict, where: str) -> Message:
    calls = []
    for j, c in enumerate(fields.items(m.get("tool_calls"), f"{where}.tool_calls",
                                       fields.MAX_TOOLS, optional=True)):
        c = fields.obj(c, f"{where}.tool_calls[{j}]")
        fn = fields.obj(c.get("function"), f"{where}.tool_calls[{j}].function")
        args = fields.text(fn.get("arguments"), f"{where}.tool_calls[{j}].function.arguments",
                           optional=True)
        calls.append(ToolCall(fields.text(c.get("id"), f"{where}.tool_calls[{j}].id",
                                          limit=fields.MAX_ID),
                              fields.name(fn.get("name"), f"{where}.tool_calls[{j}].function.name"),
                              _arguments(args)))
    return Message(Role.ASSISTANT, fields.blocks_text(m.get("content"), f"{where}.content"),
                   tuple(calls))


def _arguments(raw: str) -> dict:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"__invalid_json__": raw}
    return value if isinstance(value, dict) else {"__invalid_json__": raw}


def _tools(raw) -> tuple[ToolSpec, ...]:
    out = []
    for i, t in enumerate(fields.items(raw, "tools", fields.MAX_TOOLS, optional=True)):
        t = fields.obj(t, f"tools[{i}]")
        fn = fields.obj(t.get("function"), f"tools[{i}].function")
        out.append(ToolSpec(fields.name(fn.get("name"), f"tools[{i}].function.name"),
                            fields.text(fn.get("description"), f"tools[{i}].function.description",
                                        optional=True),
                            fields.obj(fn.get("parameters"), f"tools[{i}].function.parameters",
                                       optional=True)))
    return tuple(out)


def _wire_calls(reply: ModelReply) -> list[dict]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.input)}}
            for c in reply.tool_calls]


def usage(reply: ModelReply) -> dict:
    u = reply.usage  # input_tokens counts the uncached part, as Anthropic's does
    prompt = u.input_tokens + u.cache_read_tokens + u.cache_write_tokens
    return {"prompt_tokens": prompt, "completion_tokens": u.output_tokens,
            "total_tokens": prompt + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens}}


def completion(reply: ModelReply, model: str, call_id: str) -> dict:
    message: dict = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = _wire_calls(reply)
    return {"id": f"chatcmpl-{call_id}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                         "finish_reason": FINISH[reply.stop]}],
            "usage": usage(reply)}


def stream_chunks(reply: ModelReply, model: str, call_id: str, pieces: list[str],
                  with_usage: bool) -> list[str]:
    """The data lines of the stream, [DONE] last."""
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> str:
        return json.dumps({"id": f"chatcmpl-{call_id}", "object": "chat.completion.chunk",
                           "created": created, "model": model,
                           "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                        "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces]
    for i, c in enumerate(_wire_calls(reply)):
        out.append(chunk({"tool_calls": [{"index": i, **c}]}))
    out.append(chunk({}, FINISH[reply.stop]))
    if with_usage:
        out.append(json.dumps({"id": f"chatcmpl-{call_id}", "object": "chat.completion.chunk",
                               "created": created, "model": model, "choices": [],
                               "usage": usage(reply)}))
    return out + ["[DONE]"]


def models(model_ids: list[str]) -> dict:
    return {"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                        "owned_by": "alineo"} for m in model_ids]}


def error(exc: GatewayError) -> dict:
    return {"error": {"message": exc.message, "type": exc.code, "param": None, "code": exc.code}}


# --- the gateway as a client of an OpenAI-compatible upstream -------------------------------

def request_body(req: ModelRequest, model: str) -> dict:
    """The neutral call as a (non-streaming) chat completions request."""
    messages: list[dict] = [{"role": "system", "content": req.system}] if req.system else []
    for m in req.messages:
        if m.role is Role.USER:
            messages.append({"role": "user", "content": m.text})
        elif m.role is Role.TOOL:
            messages.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.text})
        else:
            out: dict = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                out["tool_calls"] = _wire_calls(ModelReply("", m.tool_calls))
            messages.append(out)
    body: dict = {"model": model, "messages": messages, "stream": False}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.schema}}
            for t in req.tools]
    if req.max_tokens:
        body["max_tokens"] = req.max_tokens
    return body


STOPS = {"stop": Stop.END, "tool_calls": Stop.TOOL_USE, "length": Stop.MAX_TOKENS}


def parse_completion(data: dict) -> ModelReply:
    """An upstream's completion; a shape it should not have is a GatewayError."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        calls = tuple(ToolCall(c["id"], c["function"]["name"],
                               _arguments(c["function"].get("arguments") or ""))
                      for c in message.get("tool_calls") or [])
        usage_in = data.get("usage") or {}
        cached = (usage_in.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        prompt = int(usage_in.get("prompt_tokens") or 0)
        usage_out = Usage(prompt - int(cached), int(usage_in.get("completion_tokens") or 0),
                          cache_read_tokens=int(cached))
        stop = STOPS.get(choice.get("finish_reason"), Stop.TOOL_USE if calls else Stop.END)
        return ModelReply(message.get("content") or "", calls, stop, usage_out)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise GatewayError("the upstream's answer is not a chat completion", status=502,
                           code="upstream_error") from None
