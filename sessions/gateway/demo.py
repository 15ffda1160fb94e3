"""The demo model as an upstream: offline, deterministic, labelled "[demo]".

The same directives as the bridge's demo (sandboxes/bridge/directives.py),
answered as a model would: tool directives become tool calls in the CALLER's
tool schema (a harness whose shell tool is ``Bash`` with ``command`` gets
that; one whose read tool takes ``file_path`` gets that), text is streamed in
chunks, and usage is counted (about four characters a token) so accounting
is exercised offline. When the tool results are in, it summarises them.
"""

from __future__ import annotations

import json
import math
import uuid

from sandboxes.bridge import directives

from .messages import Message, ModelReply, ModelRequest, Role, Stop, ToolCall, ToolSpec, Usage

MODEL_ID = "demo"

#: Tool names a directive may bind to, by the bridge's name (compared case-insensitively).
TOOL_NAMES = {
    "bash": ("bash", "shell", "run", "exec", "execute", "terminal"),
    "read": ("read", "read_file", "view"),
    "write": ("write", "write_file", "create_file"),
    "spawn": ("spawn", "task"),
}
#: Input keys a directive's key may bind to, in the tool's schema.
INPUT_KEYS = {
    "command": ("command", "cmd"),
    "path": ("path", "file_path", "filename", "file"),
    "content": ("content", "contents", "text"),
    "prompt": ("prompt",),
    "spec": ("spec",),
}


class DemoUpstream:
    label = "demo"

    async def complete(self, request: ModelRequest) -> ModelReply:
        return answer(request)

    def model_ids(self) -> list[str]:
        return [MODEL_ID]


def answer(request: ModelRequest) -> ModelReply:
    last_user, results = _latest(request.messages)
    if results:
        reply = ModelReply(_summary(results, request.messages))
    else:
        reply = _plan(last_user, request)
    return ModelReply(reply.text, reply.tool_calls, reply.stop,
                      _usage(request, reply))


def _latest(messages: tuple[Message, ...]) -> tuple[str, list[Message]]:
    results: list[Message] = []
    for m in reversed(messages):
        if m.role is Role.USER:
            return m.text, list(reversed(results))
        if m.role is Role.TOOL:
            results.append(m)
    return "", list(reversed(results))


def _plan(text: str, request: ModelRequest) -> ModelReply:
    planned = directives.plan(text)
    # Ids unique for the agent's whole life, not derived from the conversation:
    # a sandbox restored to an earlier checkpoint asks again from an earlier
    # point, and a tool call id is its calls' idempotency key (a repeat of a
    # completed call is answered from the journal, ids and all).
    prefix = f"call_demo_{uuid.uuid4().hex[:12]}"
    calls, missing = [], []
    for d in planned.calls:
        bound = _bind(d, request.tools, f"{prefix}_{len(calls) + 1}")
        if bound is None:
            missing.append(d.name)
        else:
            calls.append(bound)
    reply = planned.reply
    if missing:
        reply += f"\n(no tool offered for: {', '.join(missing)})"
    return ModelReply(reply, tuple(calls), Stop.TOOL_USE if calls else Stop.END)


def _bind(d: directives.Directive, tools: tuple[ToolSpec, ...], call_id: str) -> ToolCall | None:
    names = TOOL_NAMES.get(d.name, (d.name,))
    tool = next((t for n in names for t in tools if t.name.lower() == n), None)
    if tool is None:
        return None
    props = tool.schema.get("properties")
    if not isinstance(props, dict) or not props:
        return ToolCall(call_id, tool.name, dict(d.input))
    bound = {}
    for key, value in d.input.items():
        target = next((k for k in INPUT_KEYS.get(key, (key,)) if k in props), key)
        bound[target] = value
    return ToolCall(call_id, tool.name, bound)


def _summary(results: list[Message], messages: tuple[Message, ...]) -> str:
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    lines = []
    for r in results:
        first = (r.text.strip().splitlines() or [""])[0][:120]
        state = "failed" if r.is_error else "done"
        lines.append(f"- {names.get(r.tool_call_id, 'tool')} {state}" + (f": {first}" if first
                                                                            else ""))
    return "[demo] Done.\n" + "\n".join(lines)


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _usage(request: ModelRequest, reply: ModelReply) -> Usage:
    asked = request.system + "".join(m.text + json.dumps([c.input for c in m.tool_calls])
                                     for m in request.messages)
    asked += "".join(t.name + t.description + json.dumps(t.schema) for t in request.tools)
    said = reply.text + "".join(c.name + json.dumps(c.input) for c in reply.tool_calls)
    return Usage(input_tokens=_tokens(asked), output_tokens=max(1, _tokens(said)))
