"""The demo model: offline, deterministic, and always labelled "[demo]".

It reads the directives of the latest user message (prompt or steer), one a
line: run:, write <path>:, read:, spawn:, memory:, sleep:, think:, say: (directives.py,
the one definition, shared with the control plane's model gateway).

`think: N` makes the first model call of the message take N seconds (it
streams "[demo] thinking" first, then waits on the turn's cancel token, so an
interrupt ends it at once): a model call in flight at a known moment, for
the fault tests. The gateway's demo upstream (sessions/gateway/demo.py)
thinks the same way.

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
            planned = directives.plan(last_user)
            if planned.think_s:
                on_delta(THINKING)
                if cancel.wait(planned.think_s):
                    cancel.check()
            result = _plan(planned, request.turn, request.step)
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


#: What a thinking demo model call streams before it waits.
THINKING = "[demo] thinking … "


def _plan(planned: directives.Plan, turn: int, step: int) -> StepResult:
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
