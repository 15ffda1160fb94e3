"""OpenAI-compatible chat completions with streaming (OpenAI, vLLM, Ollama, llama.cpp).

The base URL and the key come from environment variables whose *names* the
config gives (the spec's credential bindings): the key itself is never in the
config, an event, the session file or a log.
"""

from __future__ import annotations

import json
import os

from .. import conversation as conv
from ..cancel import CancelToken
from .base import ConnectionLost, ModelError, OnDelta, Provider, StepRequest, StepResult, ToolCall
from .http import DEFAULT_TIMEOUT, SSEStream, parse_json, redact

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider(Provider):
    def __init__(self, model: str, options: dict, environ=os.environ):
        self.model = model
        self.label = f"openai:{model}"
        base_env = options.get("base_url_env") or "OPENAI_BASE_URL"
        key_env = options.get("api_key_env") or "OPENAI_API_KEY"
        self.base_url = (environ.get(base_env) or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = environ.get(key_env) or ""
        self.timeout = float(options.get("timeout") or DEFAULT_TIMEOUT)
        self.max_tokens = options.get("max_tokens")

    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult:
        try:
            return self._step(request, on_delta, cancel)
        except ModelError as exc:
            raise type(exc)(redact(str(exc), self.api_key)) from None  # keeps its kind

    def _step(self, request, on_delta, cancel) -> StepResult:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        stream = SSEStream(f"{self.base_url}/chat/completions", self._body(request), headers,
                           cancel=cancel, timeout=self.timeout, secret=self.api_key)
        acc = _Accumulator(on_delta)
        for _event, data in stream.events():
            if data.strip() == "[DONE]":
                acc.done = True
                break
            acc.add(parse_json(data, "chat completion chunk"))
        if not (acc.done or acc.finish_reason):
            raise ConnectionLost("model server closed the connection mid-stream")
        return acc.result()

    def _body(self, request: StepRequest) -> dict:
        body = {"model": self.model, "stream": True, "messages": to_openai(request)}
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {
                    "name": t["name"], "description": t["description"],
                    "parameters": t["input_schema"]}}
                for t in request.tools
            ]
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        return body


def to_openai(request: StepRequest) -> list[dict]:
    out = [{"role": "system", "content": request.system}] if request.system else []
    for m in request.messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["text"]})
        elif m["role"] == "assistant":
            msg = {"role": "assistant", "content": m["text"] or None}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c["input"])}}
                    for c in m["tool_calls"]
                ]
            elif not m["text"]:
                continue  # an empty interrupted reply says nothing
            out.append(msg)
        else:
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": conv.model_output(m)})
    return out


class _Accumulator:
    """Folds streamed chunks: text deltas, and tool calls whose id and name
    come first and whose JSON arguments arrive in pieces, keyed by index."""

    def __init__(self, on_delta: OnDelta):
        self.on_delta = on_delta
        self.text: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason = ""
        self.done = False

    def add(self, chunk: dict) -> None:
        if "error" in chunk:
            err = chunk["error"]
            raise ModelError(f"model error: {err.get('message') if isinstance(err, dict) else err}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
                self.on_delta(delta["content"])
            for tc in delta.get("tool_calls") or []:
                self._add_call(tc)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def _add_call(self, tc: dict) -> None:
        index = tc.get("index", len(self.calls))
        slot = self.calls.setdefault(index, {"id": "", "name": "", "args": []})
        fn = tc.get("function") or {}
        slot["id"] = tc.get("id") or slot["id"]
        slot["name"] = fn.get("name") or slot["name"]
        if fn.get("arguments"):
            slot["args"].append(fn["arguments"])

    def result(self) -> StepResult:
        calls = []
        for i, slot in sorted(self.calls.items()):
            if not slot["name"]:
                raise ModelError("model server sent a tool call without a name")
            calls.append(ToolCall(slot["id"], slot["name"], _arguments("".join(slot["args"]))))
        return StepResult("".join(self.text), calls, self.finish_reason)


def _arguments(raw: str) -> dict:
    """Tool arguments; invalid JSON goes to the tool, which answers with an
    error the model can correct, rather than failing the whole turn."""
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"__invalid_json__": raw}
    return value if isinstance(value, dict) else {"__invalid_json__": raw}
