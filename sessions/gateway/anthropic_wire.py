"""The Anthropic Messages wire format: a request read into the neutral
ModelRequest, a ModelReply written as a message or as its event stream."""

from __future__ import annotations

import json

from . import fields
from .errors import BadRequest, GatewayError
from .messages import (Api, Message, ModelReply, ModelRequest, Role, Stop, ToolCall, ToolSpec,
                       Usage)

STOP = {Stop.END: "end_turn", Stop.TOOL_USE: "tool_use", Stop.MAX_TOKENS: "max_tokens"}


def parse(body: dict) -> ModelRequest:
    model = fields.name(body.get("model"), "model")
    max_tokens = fields.count(body.get("max_tokens"), "max_tokens", optional=False)
    messages: list[Message] = []
    for i, m in enumerate(fields.items(body.get("messages"), "messages", fields.MAX_MESSAGES)):
        m = fields.obj(m, f"messages[{i}]")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be user or assistant")
        messages += _message(role, m.get("content"), f"messages[{i}].content")
    return ModelRequest(Api.ANTHROPIC, model, fields.blocks_text(body.get("system"), "system"),
                        tuple(messages), _tools(body.get("tools")),
                        stream=fields.flag(body.get("stream"), "stream"), max_tokens=max_tokens)


def _message(role: str, content, where: str) -> list[Message]:
    """One wire message: an assistant's text and tool uses; a user's tool
    results (one neutral tool message each) and text, in their order."""
    if isinstance(content, str):
        return [Message(Role(role), content)]
    texts, calls, out = [], [], []
    for j, block in enumerate(fields.items(content, where, fields.MAX_MESSAGES)):
        block = fields.obj(block, f"{where}[{j}]")
        kind = block.get("type")
        here = f"{where}[{j}]"
        if kind == "text":
            texts.append(fields.text(block.get("text"), f"{here}.text"))
        elif kind == "tool_use" and role == "assistant":
            calls.append(ToolCall(fields.text(block.get("id"), f"{here}.id", limit=fields.MAX_ID),
                                  fields.name(block.get("name"), f"{here}.name"),
                                  fields.obj(block.get("input"), f"{here}.input", optional=True)))
        elif kind == "tool_result" and role == "user":
            out.append(Message(Role.TOOL, fields.blocks_text(block.get("content"),
                                                             f"{here}.content"),
                               tool_call_id=fields.text(block.get("tool_use_id"),
                                                        f"{here}.tool_use_id", limit=fields.MAX_ID),
                               is_error=fields.flag(block.get("is_error"), f"{here}.is_error")))
        # images, documents, thinking blocks: not read by the gateway's upstreams yet
    if role == "assistant":
        return [Message(Role.ASSISTANT, "".join(texts), tuple(calls))]
    return out + ([Message(Role.USER, "".join(texts))] if texts else [])


def _tools(raw) -> tuple[ToolSpec, ...]:
    out = []
    for i, t in enumerate(fields.items(raw, "tools", fields.MAX_TOOLS, optional=True)):
        t = fields.obj(t, f"tools[{i}]")
        out.append(ToolSpec(fields.name(t.get("name"), f"tools[{i}].name"),
                            fields.text(t.get("description"), f"tools[{i}].description",
                                        optional=True),
                            fields.obj(t.get("input_schema"), f"tools[{i}].input_schema",
                                       optional=True)))
    return tuple(out)


def usage(reply: ModelReply) -> dict:
    u = reply.usage
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens,
            "cache_read_input_tokens": u.cache_read_tokens}


def _content(reply: ModelReply) -> list[dict]:
    out = [{"type": "text", "text": reply.text}] if reply.text else []
    return out + [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}
                  for c in reply.tool_calls]


def message(reply: ModelReply, model: str, call_id: str) -> dict:
    return {"id": f"msg_{call_id}", "type": "message", "role": "assistant", "model": model,
            "content": _content(reply), "stop_reason": STOP[reply.stop], "stop_sequence": None,
            "usage": usage(reply)}


def stream_events(reply: ModelReply, model: str, call_id: str,
                  pieces: list[str]) -> list[tuple[str, str]]:
    """(event, data) pairs of the stream, message_stop last."""
    start = message(reply, model, call_id)
    start.update(content=[], stop_reason=None,
                 usage={**usage(reply), "output_tokens": 0})
    out = [("message_start", {"type": "message_start", "message": start})]
    index = 0
    if reply.text:
        out += _block(index, {"type": "text", "text": ""},
                      [{"type": "text_delta", "text": p} for p in pieces])
        index += 1
    for c in reply.tool_calls:
        out += _block(index, {"type": "tool_use", "id": c.id, "name": c.name, "input": {}},
                      [{"type": "input_json_delta", "partial_json": json.dumps(c.input)}])
        index += 1
    out.append(("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": STOP[reply.stop], "stop_sequence": None},
                                  "usage": {"output_tokens": reply.usage.output_tokens}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return [(event, json.dumps(data)) for event, data in out]


def _block(index: int, start: dict, deltas: list[dict]) -> list[tuple[str, dict]]:
    return ([("content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": start})]
            + [("content_block_delta", {"type": "content_block_delta", "index": index,
                                        "delta": d}) for d in deltas]
            + [("content_block_stop", {"type": "content_block_stop", "index": index})])


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 502: "api_error", 504: "api_error"}


def error(exc: GatewayError) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(exc.status, "api_error"),
                                       "message": exc.message}}


# --- the gateway as a client of Anthropic --------------------------------------------------

def request_body(req: ModelRequest, model: str) -> dict:
    """The neutral call as a (non-streaming) Messages request; consecutive
    same-role messages are merged (tool results are user blocks)."""
    turns: list[dict] = []
    for m in req.messages:
        role, blocks = _blocks(m)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        elif blocks:
            turns.append({"role": role, "content": blocks})
    body: dict = {"model": model, "max_tokens": req.max_tokens or 4096, "messages": turns}
    if req.system:
        body["system"] = req.system
    if req.tools:
        body["tools"] = [{"name": t.name, "description": t.description,
                          "input_schema": t.schema or {"type": "object"}} for t in req.tools]
    return body


def _blocks(m: Message) -> tuple[str, list[dict]]:
    if m.role is Role.TOOL:
        return "user", [{"type": "tool_result", "tool_use_id": m.tool_call_id,
                         "content": m.text, "is_error": m.is_error}]
    if m.role is Role.USER:
        return "user", [{"type": "text", "text": m.text}] if m.text else []
    return "assistant", ([{"type": "text", "text": m.text}] if m.text else []) + [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in m.tool_calls]


STOPS = {"end_turn": Stop.END, "stop_sequence": Stop.END, "tool_use": Stop.TOOL_USE,
         "max_tokens": Stop.MAX_TOKENS}


def parse_message(data: dict) -> ModelReply:
    """An upstream's message; a shape it should not have is a GatewayError."""
    try:
        texts, calls = [], []
        for block in data["content"]:
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                calls.append(ToolCall(block["id"], block["name"], dict(block.get("input") or {})))
        u = data.get("usage") or {}
        usage_out = Usage(int(u.get("input_tokens") or 0), int(u.get("output_tokens") or 0),
                          int(u.get("cache_read_input_tokens") or 0),
                          int(u.get("cache_creation_input_tokens") or 0))
        stop = STOPS.get(data.get("stop_reason"), Stop.TOOL_USE if calls else Stop.END)
        return ModelReply("".join(texts), tuple(calls), stop, usage_out)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise GatewayError("the upstream's answer is not a message", status=502,
                           code="upstream_error") from None
