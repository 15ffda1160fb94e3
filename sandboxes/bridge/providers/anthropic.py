"""Anthropic Messages API with streaming (content blocks, tool_use / tool_result)."""

from __future__ import annotations

import json
import os

from .. import conversation as conv
from ..cancel import CancelToken
from .base import ConnectionLost, ModelError, OnDelta, Provider, StepRequest, StepResult, ToolCall
from .http import DEFAULT_TIMEOUT, SSEStream, parse_json, redact

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096


class AnthropicProvider(Provider):
    def __init__(self, model: str, options: dict, environ=os.environ):
        self.model = model
        self.label = f"anthropic:{model}"
        base_env = options.get("base_url_env") or "ANTHROPIC_BASE_URL"
        key_env = options.get("api_key_env") or "ANTHROPIC_API_KEY"
        self.base_url = (environ.get(base_env) or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = environ.get(key_env) or ""
        self.timeout = float(options.get("timeout") or DEFAULT_TIMEOUT)
        self.max_tokens = int(options.get("max_tokens") or DEFAULT_MAX_TOKENS)

    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult:
        try:
            return self._step(request, on_delta, cancel)
        except ModelError as exc:
            raise type(exc)(redact(str(exc), self.api_key)) from None  # keeps its kind

    def _step(self, request, on_delta, cancel) -> StepResult:
        headers = {"x-api-key": self.api_key, "anthropic-version": API_VERSION}
        stream = SSEStream(f"{self.base_url}/v1/messages", self._body(request), headers,
                           cancel=cancel, timeout=self.timeout, secret=self.api_key)
        acc = _Accumulator(on_delta)
        for _event, data in stream.events():
            acc.add(parse_json(data, "message stream event"))
            if acc.stopped:
                break
        if not acc.stopped:
            raise ConnectionLost("model server closed the connection mid-stream")
        return acc.result()

    def _body(self, request: StepRequest) -> dict:
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": True,
                "messages": to_anthropic(request.messages)}
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [{"name": t["name"], "description": t["description"],
                              "input_schema": t["input_schema"]} for t in request.tools]
        return body


def to_anthropic(messages: list[dict]) -> list[dict]:
    """Neutral messages as Messages API turns. Tool results travel in user
    turns, and consecutive same-role turns are merged (a steer right after tool
    results is one user turn holding both)."""
    out: list[dict] = []
    for m in messages:
        role, blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return out


def _blocks(m: dict) -> tuple[str, list[dict]]:
    if m["role"] == "user":
        return "user", [{"type": "text", "text": m["text"]}] if m["text"] else []
    if m["role"] == "assistant":
        blocks = [{"type": "text", "text": m["text"]}] if m["text"] else []
        blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["input"]}
                   for c in m.get("tool_calls", ())]
        return "assistant", blocks
    return "user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"],
                     "content": conv.model_output(m), "is_error": bool(m.get("is_error"))}]


class _Accumulator:
    """Folds content_block_start/delta events into text and tool_use blocks."""

    def __init__(self, on_delta: OnDelta):
        self.on_delta = on_delta
        self.blocks: dict[int, dict] = {}
        self.stop_reason = ""
        self.stopped = False

    def add(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "error":
            err = event.get("error") or {}
            raise ModelError(f"model error: {err.get('type', '')}: {err.get('message', '')}")
        if kind == "content_block_start":
            self._start(event.get("index", len(self.blocks)), event.get("content_block") or {})
        elif kind == "content_block_delta":
            self._delta(event.get("index", 0), event.get("delta") or {})
        elif kind == "message_delta":
            self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
        elif kind == "message_stop":
            self.stopped = True

    def _start(self, index: int, block: dict) -> None:
        if block.get("type") == "tool_use":
            self.blocks[index] = {"type": "tool_use", "id": block.get("id", ""),
                                  "name": block.get("name", ""), "json": []}
        else:
            self.blocks[index] = {"type": "text", "text": []}
            if block.get("text"):
                self._text(self.blocks[index], block["text"])

    def _delta(self, index: int, delta: dict) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": []})
        if delta.get("type") == "text_delta" and block["type"] == "text":
            self._text(block, delta.get("text", ""))
        elif delta.get("type") == "input_json_delta" and block["type"] == "tool_use":
            block["json"].append(delta.get("partial_json", ""))

    def _text(self, block: dict, text: str) -> None:
        block["text"].append(text)
        self.on_delta(text)

    def result(self) -> StepResult:
        text, calls = [], []
        for _, b in sorted(self.blocks.items()):
            if b["type"] == "text":
                text.append("".join(b["text"]))
            else:
                calls.append(ToolCall(b["id"], b["name"], _input("".join(b["json"]))))
        return StepResult("".join(text), calls, self.stop_reason)


def _input(raw: str) -> dict:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"__invalid_json__": raw}
    return value if isinstance(value, dict) else {"__invalid_json__": raw}
