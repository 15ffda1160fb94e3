"""Turns: prompt → model step → tool calls → results → … → a settled end.

One runner thread takes queued prompts in FIFO order and runs one turn at a
time. Every state change happens under the session lock and ends with a
commit, in this order within a step:

1. step boundary: pending steers become user messages (`steer.delivered`);
2. the model call (no lock held), its text streamed as coalesced `message.delta`;
3. STEP CHECKPOINT: the assistant message with its pending tool calls is
   committed (`message.assistant`, `tool.dispatched`) before any tool runs, so
   a resumed bridge never re-sends a model call that completed;
4. each tool result is committed as it finishes (`tool.result`).

`abort` settles the turn from the caller's thread at once (under the lock)
and then cancels the runner's token; the runner notices the turn is no longer
the current one and drops whatever its blocked call returns.
"""

from __future__ import annotations

import copy
import json

from . import conversation as conv
from . import orphans
from .cancel import Cancelled, CancelToken
from .harness import Busy, Harness
from .hooks import Hooks
from .providers import BudgetExceeded, ModelError, Provider, StepRequest
from .session import Session
from .tools import ToolContext, ToolOutcome, run_tool

__all__ = ["Busy", "Runner", "SYSTEM_PROMPT"]

SYSTEM_PROMPT = (
    "You are a coding agent working in a sandbox. Your home directory is the "
    "working directory of every tool. Use the tools to act, then answer briefly."
)


class Runner(Harness):
    """The built-in harness: our own model calls (providers/) and tools (tools.py)."""

    def __init__(self, session: Session, provider: Provider, tool_ctx: ToolContext,
                 tool_schemas: list[dict], hooks: Hooks, *, max_steps: int = 50,
                 system: str = SYSTEM_PROMPT):
        super().__init__(session, hooks, provider.label)
        self.thread.name = "runner"
        self.provider = provider
        self.tool_ctx = tool_ctx
        self.tool_schemas = tool_schemas
        self.max_steps = max_steps
        self.system = system
        self.cancel: CancelToken | None = None

    def pending_requests(self) -> tuple:
        return tuple(self.tool_ctx.requests.pending())

    def _cancel_handle(self):
        return self.cancel

    def _cancel_running(self, handle, reason: str) -> None:
        if handle is not None:
            handle.cancel(reason)  # kills process groups, closes sockets

    def _on_turn_start(self) -> None:
        self.cancel = CancelToken()

    def _after_restart(self, cur: dict | None) -> None:
        if cur is not None:
            orphans.kill_leftover(cur.get("process"))

    # --- the runner thread ----------------------------------------------------------
    def _run_turn(self, item: dict) -> None:
        turn, cancel = item["turn"], self.cancel
        while True:
            request = self._boundary(turn)
            if request is None:
                return
            try:
                result = self.provider.step(request, lambda t: self._delta(turn, t), cancel)
            except Cancelled:
                return
            except BudgetExceeded as exc:
                self._fail(turn, "budget_exceeded", str(exc))
                return
            except ModelError as exc:
                self._fail(turn, "model_error", str(exc))
                return
            calls = self._checkpoint(turn, result)
            if calls is None:
                return
            if not calls:
                if self._finish_unless_steered(turn, result.text):
                    return
                continue
            for call in calls:
                if not self._run_call(turn, call, cancel):
                    return

    def _boundary(self, turn: int) -> StepRequest | None:
        """Deliver pending steers and snapshot the conversation for the next step."""
        with self.session.lock:
            if self.state.get("paused") and self._live(turn) is not None:
                self.session.emit("turn.held", {"turn": turn, "step": self._live(turn)["step"]})
                self.session.commit()
                self.session.changed.wait_for(
                    lambda: not self.state.get("paused") or self._live(turn) is None or self.stopping)
            cur = self._live(turn)
            if cur is None or self.stopping:
                return None
            if cur["step"] >= self.max_steps:
                self._settle(cur, "max_steps")
                self.session.commit()
                return None
            steers, cur["steers"] = cur["steers"], []
            for text in steers:
                self.state["messages"].append(conv.user(text, "steer"))
                self.session.emit("steer.delivered", {"turn": turn, "text": text})
            cur["step"] += 1
            self.session.commit()
            self._reset_delta()
            return StepRequest(copy.deepcopy(self.state["messages"]), self.tool_schemas,
                               self.system, turn, cur["step"])

    def _checkpoint(self, turn: int, result) -> list[dict] | None:
        """The step checkpoint: model output and pending calls, before any tool runs."""
        with self.session.lock:
            cur = self._live(turn)
            if cur is None:
                return None
            calls = self._unique_ids(turn, cur["step"], [c.as_dict() for c in result.tool_calls])
            self.state["messages"].append(conv.assistant(result.text, calls))
            cur["partial"], self._delta_buf = "", ""
            if result.text:
                cur["texts"].append(result.text)
                self.session.emit("message.assistant", {"turn": turn, "text": result.text})
            for c in calls:
                self.session.emit("tool.dispatched", {"turn": turn, "tool_call_id": c["id"],
                                                      "name": c["name"], "input": c["input"]})
            self.session.commit()
            return calls

    def _unique_ids(self, turn: int, step: int, calls: list[dict]) -> list[dict]:
        """Keep the provider's call ids unless missing or reused (some local
        servers send none); the id is the tools' idempotency key."""
        used = {c["id"] for m in self.state["messages"] if m["role"] == "assistant"
                for c in m.get("tool_calls", ())}
        for i, c in enumerate(calls, 1):
            if not c["id"] or c["id"] in used:
                c["id"] = f"call-t{turn}-s{step}-{i}"
            used.add(c["id"])
        return calls

    def _run_call(self, turn: int, call: dict, cancel: CancelToken) -> bool:
        if cancel.cancelled:
            return False
        outcome = self._pre_tool_use(turn, call)
        if outcome is None:
            ctx = copy.copy(self.tool_ctx)
            ctx.emit = lambda type_, data: self._emit_live(turn, type_, data)
            ctx.on_process = lambda pid: self._note_process(turn, call, pid)
            outcome = run_tool(ctx, call, cancel)
        with self.session.lock:
            if self._live(turn) is None:
                return False  # aborted meanwhile: the abort already closed this call
            self._record_result(turn, call, outcome.output, outcome.exit_code,
                                outcome.is_error, outcome.interrupted, outcome.stderr)
            self._live(turn).pop("process", None)
            self.session.commit()
            return True

    def _pre_tool_use(self, turn: int, call: dict) -> ToolOutcome | None:
        env = {"ALINEO_TOOL_NAME": call["name"], "ALINEO_TOOL_CALL_ID": call["id"],
               "ALINEO_TOOL_INPUT": json.dumps(call["input"])}
        verdict = self._hook("pre_tool_use", env, {"turn": turn, "tool_call_id": call["id"]})
        if verdict is None or verdict.verdict == "allow":
            return None
        why = verdict.output.strip()[:500]
        return ToolOutcome(f"denied by the pre_tool_use hook: {why}", 1, True)

    def _note_process(self, turn: int, call: dict, pid: int) -> None:
        # Remembered so a restarted bridge can kill what its predecessor left
        # running: an "interrupted" call must not keep writing behind our back.
        with self.session.lock:
            cur = self._live(turn)
            if cur is not None:
                cur["process"] = {"pid": pid, "tool_call_id": call["id"]}
                self.session.commit()

    def _emit_live(self, turn: int, type_: str, data: dict) -> None:
        with self.session.lock:
            if self._live(turn) is not None:
                self.session.emit(type_, {"turn": turn, **data})
                self.session.commit()

    def _finish_unless_steered(self, turn: int, text: str) -> bool:
        with self.session.lock:
            cur = self._live(turn)
            if cur is None:
                return True
            if cur["steers"]:
                return False  # a steer arrived during the last step: one more step
            self._finish(turn, text)
        self._hook("stop", {"ALINEO_TURN": str(turn)}, {"turn": turn})
        return True
