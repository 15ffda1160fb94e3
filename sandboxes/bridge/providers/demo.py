"""The demo model: offline, deterministic, and always labelled "[demo]".

It reads the directives of the latest user message (prompt or steer), one a
line: run:, write <path>:, read:, spawn:, sleep:, say: (directives.py, the one
definition, shared with the control plane's model gateway).

All tool directives of a message become ONE step with several tool calls, run
in order. Once their results are in, the next step is a final answer that
summarises them (exit codes) and makes no tool call. A message with no
directive gets a short plain reply.
"""

from __future__ import annotations

from .. import directives
from ..cancel import CancelToken
from .base import OnDelta, Provider, StepRequest, StepResult, ToolCall


class DemoProvider(Provider):
    label = "demo"

    def step(self, request: StepRequest, on_delta: OnDelta, cancel: CancelToken) -> StepResult:
        cancel.check()
        last_user, results = _latest(request.messages)
        if results:
            result = StepResult(_summary(results), [], "end_turn")
        else:
            result = _plan(last_user, request.turn, request.step)
        for chunk in directives.chunks(result.text):
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
    planned = directives.plan(text)
    calls = [ToolCall(f"demo-{turn}-{step}-{n}", d.name, d.input)
             for n, d in enumerate(planned.calls, 1)]
    return StepResult(planned.reply, calls, "tool_use" if calls else "end_turn")


def _summary(results: list[dict]) -> str:
    lines = []
    for r in results:
        said = r["output"].strip() or str(r.get("stderr") or "").strip()  # stdout, else stderr
        first = (said.splitlines() or [""])[0][:120]
        state = "was interrupted" if r.get("interrupted") else f"exited {r['exit_code']}"
        lines.append(f"- {r['name']} {state}" + (f": {first}" if first else ""))
    return "[demo] Done.\n" + "\n".join(lines)
