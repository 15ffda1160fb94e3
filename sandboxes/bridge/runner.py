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
import logging
import threading
import time

from . import conversation as conv
from . import orphans
from .cancel import Cancelled, CancelToken
from .hooks import Hooks
from .protocol import (
    PROTOCOL_VERSION,
    AbortAnswer,
    BridgeState,
    PauseAnswer,
    PromptAnswer,
    SeedAnswer,
    Status,
    SteerAnswer,
    TurnInfo,
)
from .providers import BudgetExceeded, ModelError, Provider, StepRequest
from .session import Session, utcnow
from .tools import ToolContext, ToolOutcome, run_tool

log = logging.getLogger("bridge")

#: message.delta coalescing: emit when this much text is buffered or this
#: many seconds passed since the last delta (each emit is a file commit).
DELTA_CHARS = 400
DELTA_SECONDS = 0.5

SYSTEM_PROMPT = (
    "You are a coding agent working in a sandbox. Your home directory is the "
    "working directory of every tool. Use the tools to act, then answer briefly."
)


class Busy(Exception):
    """A request the runner cannot take in its current state (code, message)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Runner:
    def __init__(self, session: Session, provider: Provider, tool_ctx: ToolContext,
                 tool_schemas: list[dict], hooks: Hooks, *, max_steps: int = 50,
                 system: str = SYSTEM_PROMPT):
        self.session = session
        self.provider = provider
        self.tool_ctx = tool_ctx
        self.tool_schemas = tool_schemas
        self.hooks = hooks
        self.max_steps = max_steps
        self.system = system
        self.cancel: CancelToken | None = None
        self.stopping = False
        self._delta_buf = ""
        self._delta_at = 0.0
        self.source = "startup"  # session_start source, set by resume()
        self.thread = threading.Thread(target=self._loop, name="runner", daemon=True)

    @property
    def state(self) -> dict:
        return self.session.state

    # --- requests from clients (any thread) -------------------------------------
    def enqueue(self, text: str, command_id: str | None) -> PromptAnswer:
        """Accept a prompt; FIFO behind the running turn. A command id seen
        before returns the turn it was given, with no second effect."""
        with self.session.lock:
            turn = self.session.turn_for(command_id)
            if turn is not None:
                return PromptAnswer(turn, duplicate=True)
            self.state["turns"] += 1
            turn = self.state["turns"]
            self.state["queue"].append({"turn": turn, "command_id": command_id, "text": text})
            self.session.remember(command_id, turn)
            ahead = len(self.state["queue"]) - 1 + (1 if self.state["current"] else 0)
            self.session.commit()
            return PromptAnswer(turn, queued=ahead > 0, position=ahead)

    def steer(self, text: str, command_id: str | None = None) -> SteerAnswer:
        """Deliver at the next step boundary. `command_id` is an idempotency key,
        as for prompts: a steer sent again after a crash is delivered once."""
        with self.session.lock:
            seen = self.session.turn_for(command_id)
            if seen is not None:
                return SteerAnswer(seen, duplicate=True)
            cur = self.state["current"]
            if cur is None:
                raise Busy("no_turn", "no turn is running: send a prompt instead")
            cur["steers"].append(text)
            self.session.remember(command_id, cur["turn"])
            self.session.commit()  # an accepted steer must survive a crash
            return SteerAnswer(cur["turn"])

    def abort(self, reason: str = "aborted") -> AbortAnswer:
        with self.session.lock:
            cur, token = self.state["current"], self.cancel
            if cur is None:
                return AbortAnswer(False)
            self._settle(cur, reason)
            self.session.commit()
        if token is not None:
            token.cancel(reason)  # outside the lock: kills process groups, closes sockets
        return AbortAnswer(True, cur["turn"])

    def pause(self, paused: bool) -> PauseAnswer:
        """Hold (or release) the agent: the step in flight finishes, the next
        one waits at its boundary, and no queued prompt starts. Persisted, so
        a paused agent stays paused across a bridge restart."""
        with self.session.lock:
            if bool(self.state.get("paused")) != paused:
                self.state["paused"] = paused
                cur = self.state["current"]
                self.session.emit("bridge.paused" if paused else "bridge.unpaused",
                                  {"turn": cur["turn"] if cur else None})
                self.session.commit()
                self.session.changed.notify_all()
            return PauseAnswer(paused)

    def seed(self, messages, turns=None) -> SeedAnswer:
        """Start a fresh session from a conversation (the "rebuild" rung)."""
        msgs = conv.validate(messages)
        with self.session.lock:
            if self.state["messages"] or self.state["current"] or self.state["queue"]:
                raise Busy("not_fresh", "seed needs a session with no conversation yet")
            self.state["messages"] = msgs
            self._close_dangling(None, "seeded")
            self.state["turns"] = int(turns) if turns else sum(
                1 for m in msgs if m["role"] == "user" and m["kind"] == "prompt")
            self.session.emit("session.seeded",
                              {"messages": len(msgs), "turns": self.state["turns"]})
            self.session.commit()
            return SeedAnswer(len(msgs), self.state["turns"])

    def status(self) -> Status:
        with self.session.lock:
            cur = self.state["current"]
            return Status(
                state=BridgeState.RUNNING if cur else BridgeState.IDLE,
                paused=bool(self.state.get("paused")),
                turn=None if cur is None else TurnInfo(cur["turn"], cur["command_id"], cur["step"]),
                queued=tuple(q["turn"] for q in self.state["queue"]),
                head=self.session.head(),
                acked=self.state["acked"],
                session_id=self.state["session_id"],
                model=self.provider.label,
                turns=self.state["turns"],
                pending_requests=tuple(self.tool_ctx.requests.pending()),
                protocol=PROTOCOL_VERSION,
            )

    # --- startup and shutdown ---------------------------------------------------------
    def resume(self, resumed: bool, source: str) -> None:
        """Settle what a previous bridge left running, before anything is served."""
        with self.session.lock:
            self.session.emit("bridge.started", {"resumed": resumed, "session_start_source": source,
                                                 "model": self.provider.label})
            cur = self.state["current"]
            if cur is not None:
                orphans.kill_leftover(cur.get("process"))
                self._settle(cur, "bridge_restarted")
            else:
                self._close_dangling(None, "bridge_restarted")
            self.session.commit()
        self.source = source

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.abort("shutdown")
        with self.session.lock:
            self.stopping = True
            self.session.changed.notify_all()

    # --- the runner thread ----------------------------------------------------------
    def _loop(self) -> None:
        self._hook("session_start", {"ALINEO_SESSION_START_SOURCE": self.source},
                   {"source": self.source})
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self._run_turn(item)
            except Exception:  # noqa: BLE001 - a bug must not kill the bridge
                log.exception("turn %s crashed", item["turn"])
                self._fail(item["turn"], "internal", "the bridge hit an internal error")

    def _next(self) -> dict | None:
        with self.session.lock:
            self.session.changed.wait_for(
                lambda: (self.state["queue"] and not self.state.get("paused")) or self.stopping)
            if self.stopping:
                return None
            item = self.state["queue"].pop(0)
            self.state["current"] = {"turn": item["turn"], "command_id": item["command_id"],
                                     "step": 0, "texts": [], "partial": "", "steers": [],
                                     "started_at": utcnow()}
            self.cancel = CancelToken()
            self.session.emit("turn.started",
                              {"turn": item["turn"], "command_id": item["command_id"]})
            self.state["messages"].append(conv.user(item["text"]))
            self.session.emit("message.user", {"turn": item["turn"], "text": item["text"]})
            self.session.commit()
            return item

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

    def _live(self, turn: int) -> dict | None:
        cur = self.state["current"]
        return cur if cur is not None and cur["turn"] == turn else None

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
            self._delta_buf, self._delta_at = "", time.monotonic()
            return StepRequest(copy.deepcopy(self.state["messages"]), self.tool_schemas,
                               self.system, turn, cur["step"])

    def _delta(self, turn: int, text: str) -> None:
        with self.session.lock:
            cur = self._live(turn)
            if cur is None or not text:
                return
            cur["partial"] += text
            self._delta_buf += text
            due = time.monotonic() - self._delta_at >= DELTA_SECONDS
            if len(self._delta_buf) >= DELTA_CHARS or due:
                # A tail that could begin a bound value waits for the next
                # chunk, so no value is ever written in two pieces (redact.py).
                held = self.session.file.redactor.held(self._delta_buf)
                text = self._delta_buf[:len(self._delta_buf) - held]
                self.session.emit("message.delta", {"turn": turn, "text": text})
                self._delta_buf, self._delta_at = self._delta_buf[len(text):], time.monotonic()
                self.session.commit()

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
            self._record_result(turn, call, outcome)
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

    def _record_result(self, turn: int | None, call: dict, outcome: ToolOutcome) -> None:
        msg = conv.tool_result(call, outcome.output, outcome.exit_code, outcome.is_error,
                               outcome.interrupted)
        self.state["messages"].append(msg)
        self.session.emit("tool.result", _result_event(turn, msg))

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
            self.session.emit("turn.finished", {"turn": turn, "text": text})
            self.state["current"] = None
            self.session.commit()
        self._hook("stop", {"ALINEO_TURN": str(turn)}, {"turn": turn})
        return True

    def _fail(self, turn: int, reason: str, message: str) -> None:
        with self.session.lock:
            cur = self._live(turn)
            if cur is None:
                return
            model = reason in ("model_error", "budget_exceeded")
            self.session.emit("model.error" if model else "bridge.error",
                              {"turn": turn, "message": message})
            self._settle(cur, reason)
            self.session.commit()

    # --- settling (lock held) --------------------------------------------------------
    def _settle(self, cur: dict, reason: str) -> None:
        """End a running turn as interrupted, exactly once: close its dangling
        tool calls and keep the text that survived."""
        turn = cur["turn"]
        self._close_dangling(turn, reason)
        if cur["partial"]:
            self.state["messages"].append(conv.assistant(cur["partial"], interrupted=True))
        text = "\n\n".join([*cur["texts"], cur["partial"]] if cur["partial"] else cur["texts"])
        data = {"turn": turn, "text": text, "reason": reason}
        if cur["steers"]:
            data["undelivered_steers"] = list(cur["steers"])
        self.session.emit("turn.interrupted", data)
        self.state["current"] = None

    def _close_dangling(self, turn: int | None, reason: str) -> None:
        for msg in conv.close_dangling(self.state["messages"], reason):
            self.session.emit("tool.result", _result_event(turn, msg))

    def _hook(self, name: str, env: dict, extra: dict):
        if not self.hooks.has(name):
            return None
        verdict = self.hooks.run(name, env)
        with self.session.lock:
            self.session.emit("hook.verdict", verdict.as_event(**extra))
            self.session.commit()
        return verdict


def _result_event(turn: int | None, msg: dict) -> dict:
    data = {"turn": turn, "tool_call_id": msg["tool_call_id"], "name": msg["name"],
            "output": msg["output"], "exit_code": msg["exit_code"], "is_error": msg["is_error"]}
    if msg.get("interrupted"):
        data["interrupted"] = True
    return data
