"""The demo model: offline, deterministic, and always labelled "[demo]".

It reads directives in the latest user message (prompt or steer), one a line:

    run: <shell command>      → a bash tool call
    write <path>: <text>      → a write tool call ("\\n" in <text> becomes a newline)
    read: <path>              → a read tool call
    spawn: <prompt>           → a spawn tool call (asks the control plane for a child)
    spawn: {"prompt": …, "spec": {…}}
                              → the same with a child spec, as a real model may send
    sleep: <seconds>          → a bash `sleep` tool call (a long step, for fault tests)
    say: <text>               → <text> in the reply

All tool directives of a message become ONE step with several tool calls, run
in order. Once their results are in, the next step is a final answer that
summarises them (exit codes) and makes no tool call. A message with no
directive gets a short plain reply.
"""

from __future__ import annotations

import json
import re
import shlex

from ..cancel import CancelToken
from .base import OnDelta, Provider, StepRequest, StepResult, ToolCall

_WRITE = re.compile(r"^write\s+(?P<path>[^:]+?)\s*:\s?(?P<text>.*)$")
_KEYED = re.compile(r"^(?P<key>run|read|spawn|sleep|say)\s*:\s?(?P<value>.*)$")


class DemoProvider(Provider):
    label = "demo"

    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult:
        cancel.check()
        last_user, results = _latest(request.messages)
        if results:
            result = StepResult(_summary(results), [], "end_turn")
        else:
            result = _plan(last_user, request.turn, request.step)
        for chunk in _chunks(result.text):
            on_delta(chunk)
        return result


def _latest(messages: list[dict]) -> tuple[str, list[dict]]:
    """The latest user text and the tool results that came after it."""
    results: list[dict] = []
    for m in reversed(messages):
        if m["role"] == "user":
            return m["text"], list(reversed(results))
        if m["role"] == "tool":
            results.append(m)
    return "", list(reversed(results))


def _plan(text: str, turn: int, step: int) -> StepResult:
    says, calls = [], []
    for line in text.splitlines():
        call_input, name, say = _directive(line.strip())
        if say is not None:
            says.append(say)
        elif name:
            calls.append(ToolCall(f"demo-{turn}-{step}-{len(calls) + 1}", name, call_input))
    if says:
        reply = "[demo] " + "\n".join(says)
    elif calls:
        reply = f"[demo] Running {len(calls)} tool call{'s' if len(calls) > 1 else ''}."
    else:
        reply = ("[demo] I am the demo model. Give me directives, one a line: "
                 "run:, write <path>:, read:, spawn:, sleep:, say:.")
    return StepResult(reply, calls, "tool_use" if calls else "end_turn")


def _directive(line: str) -> tuple[dict, str, str | None]:
    """(tool input, tool name, say text) of one line; ("", None) when none."""
    m = _WRITE.match(line)
    if m:
        return {"path": m["path"], "content": m["text"].replace("\\n", "\n")}, "write", None
    m = _KEYED.match(line)
    if not m:
        return {}, "", None
    key, value = m["key"], m["value"].strip()
    if key == "say":
        return {}, "", value
    if key == "run":
        return {"command": value}, "bash", None
    if key == "sleep":
        return {"command": f"sleep {shlex.quote(value)}"}, "bash", None
    if key == "read":
        return {"path": value}, "read", None
    return _spawn_input(value), "spawn", None


def _spawn_input(value: str) -> dict:
    """`spawn:`'s tool input: a JSON object with a prompt (and a spec) passes
    as is, so the demo can ask for any child a real model could; any other
    text is the child's prompt."""
    if value.startswith("{"):
        try:
            asked = json.loads(value)
        except ValueError:
            asked = None
        if isinstance(asked, dict) and isinstance(asked.get("prompt"), str):
            return {k: v for k, v in asked.items() if k in ("prompt", "spec")}
    return {"prompt": value}


def _summary(results: list[dict]) -> str:
    lines = []
    for r in results:
        first = (r["output"].strip().splitlines() or [""])[0][:120]
        state = "was interrupted" if r.get("interrupted") else f"exited {r['exit_code']}"
        lines.append(f"- {r['name']} {state}" + (f": {first}" if first else ""))
    return "[demo] Done.\n" + "\n".join(lines)


def _chunks(text: str, size: int = 16):
    # Stream in pieces like a real model, so message.delta is exercised offline.
    for i in range(0, len(text), size):
        yield text[i:i + size]
