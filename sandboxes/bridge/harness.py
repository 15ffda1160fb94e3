"""The harness adapter: what every harness behind the bridge provides.

The bridge's socket, session file, numbered events and cursor are the same
for every harness; a harness is what runs the turns. Two implement it:
the built-in one (runner.py: our own model calls and tools) and Pi
(pi.py: ``pi --mode rpc`` as a child process). docs/HARNESSES.md says how
to add the next one.

A harness gets prompts (FIFO, numbered at enqueue), steers, aborts, pauses,
a seed conversation (the "rebuild" rung) and a restart (``resume``), and turns
them into the same facts: ``turn.started``, ``message.user``,
``message.delta``/``message.assistant``, ``tool.dispatched``/``tool.result``,
``steer.delivered``, ``turn.finished`` or ``turn.interrupted``. It keeps the
provider-neutral conversation (conversation.py) in the session state as it
goes, whatever its own session format is.
"""

from __future__ import annotations

import abc
import logging
import threading
import time

from . import conversation as conv
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
from .session import Session, utcnow

log = logging.getLogger("bridge")

#: message.delta coalescing: emit when this much text is buffered or this
#: many seconds passed since the last delta (each emit is a file commit).
DELTA_CHARS = 400
DELTA_SECONDS = 0.5


class Busy(Exception):
    """A request the harness cannot take in its current state (code, message)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Harness(abc.ABC):
    """The shared half of a harness: the prompt queue, pause, status, the
    coalesced deltas and settling a turn. Subclasses run the turns."""

    name = "builtin"

    def __init__(self, session: Session, hooks: Hooks, label: str):
        self.session = session
        self.hooks = hooks
        self.label = label
        self.stopping = False
        self.source = "startup"  # session_start source, set by resume()
        self._delta_buf = ""
        self._delta_at = 0.0
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)

    @property
    def state(self) -> dict:
        return self.session.state

    # --- what a subclass provides -----------------------------------------------------
    @abc.abstractmethod
    def _run_turn(self, item: dict) -> None:
        """Run one started turn to its settled end (or until it is aborted)."""

    def _after_turn(self, turn: int) -> None:
        """After a turn, outside the lock (Pi runs the stop hook here)."""

    def _deliver_steer(self, text: str) -> None:
        """Hand an accepted steer to the harness now (the built-in one takes
        it from the turn's state at its next step boundary)."""

    def _after_seed(self, messages: list[dict]) -> None:
        """Write a seeded conversation where the harness reads it (lock held)."""

    def _cancel_handle(self):
        """What :meth:`_cancel_running` needs to stop the running turn, taken
        under the lock (a later turn's handle must never be cancelled)."""
        return None

    def _cancel_running(self, handle, reason: str) -> None:
        """Stop what the aborted turn still runs (called without the lock)."""

    def _on_turn_start(self) -> None:
        """A turn was just made current (lock held)."""

    def _after_restart(self, cur: dict | None) -> None:
        """What a restarted bridge must clean up of its predecessor (lock held)."""

    def pending_requests(self) -> tuple:
        return ()

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
        self._deliver_steer(text)
        return SteerAnswer(cur["turn"])

    def seed(self, messages, turns=None) -> SeedAnswer:
        """Start a fresh session from a conversation (the "rebuild" rung)."""
        msgs = conv.validate(messages)
        with self.session.lock:
            if self.state["messages"] or self.state["current"] or self.state["queue"]:
                raise Busy("not_fresh", "seed needs a session with no conversation yet")
            self.state["messages"] = msgs
            self._close_dangling(None, "seeded")
            self._after_seed(self.state["messages"])
            self.state["turns"] = int(turns) if turns else sum(
                1 for m in msgs if m["role"] == "user" and m["kind"] == "prompt")
            self.session.emit("session.seeded",
                              {"messages": len(msgs), "turns": self.state["turns"]})
            self.session.commit()
            return SeedAnswer(len(msgs), self.state["turns"])

    def abort(self, reason: str = "aborted") -> AbortAnswer:
        with self.session.lock:
            cur, handle = self.state["current"], self._cancel_handle()
            if cur is None:
                return AbortAnswer(False)
            self._settle(cur, reason)
            self.session.commit()
        self._cancel_running(handle, reason)
        return AbortAnswer(True, cur["turn"])

    def pause(self, paused: bool) -> PauseAnswer:
        """Hold (or release) the agent: no queued prompt starts (and the
        built-in harness holds at its next step boundary). Persisted, so a
        paused agent stays paused across a bridge restart."""
        with self.session.lock:
            if bool(self.state.get("paused")) != paused:
                self.state["paused"] = paused
                cur = self.state["current"]
                self.session.emit("bridge.paused" if paused else "bridge.unpaused",
                                  {"turn": cur["turn"] if cur else None})
                self.session.commit()
                self.session.changed.notify_all()
            return PauseAnswer(paused)

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
                model=self.label,
                turns=self.state["turns"],
                pending_requests=self.pending_requests(),
                protocol=PROTOCOL_VERSION,
            )

    # --- startup and shutdown ---------------------------------------------------------
    def resume(self, resumed: bool, source: str) -> None:
        """Settle what a previous bridge left running, before anything is served."""
        with self.session.lock:
            started = {"resumed": resumed, "session_start_source": source, "model": self.label}
            if self.name != Harness.name:
                started["harness"] = self.name
            self.session.emit("bridge.started", started)
            cur = self.state["current"]
            self._after_restart(cur)
            if cur is not None:
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

    # --- the turn loop (the harness's thread) --------------------------------------------
    def _loop(self) -> None:
        self._hook("session_start", {"ALINEO_SESSION_START_SOURCE": self.source},
                   {"source": self.source})
        while True:
            item = self._wait_next()
            if item is None:
                return
            try:
                self._run_turn(item)
            except Exception:  # noqa: BLE001 - a bug must not kill the bridge
                log.exception("turn %s crashed", item["turn"])
                self._fail(item["turn"], "internal", "the bridge hit an internal error")
            self._after_turn(item["turn"])

    def _wait_next(self) -> dict | None:
        """Take the next queued prompt and start its turn (None: stopping)."""
        with self.session.lock:
            self.session.changed.wait_for(
                lambda: (self.state["queue"] and not self.state.get("paused")) or self.stopping)
            if self.stopping:
                return None
            item = self.state["queue"].pop(0)
            self.state["current"] = {"turn": item["turn"], "command_id": item["command_id"],
                                     "step": 0, "texts": [], "partial": "", "steers": [],
                                     "started_at": utcnow()}
            self._on_turn_start()
            self.session.emit("turn.started",
                              {"turn": item["turn"], "command_id": item["command_id"]})
            self.state["messages"].append(conv.user(item["text"]))
            self.session.emit("message.user", {"turn": item["turn"], "text": item["text"]})
            self.session.commit()
            return item

    def _live(self, turn: int) -> dict | None:
        cur = self.state["current"]
        return cur if cur is not None and cur["turn"] == turn else None

    def _reset_delta(self) -> None:
        self._delta_buf, self._delta_at = "", time.monotonic()

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

    def _record_result(self, turn: int | None, call: dict, output: str, exit_code: int,
                       is_error: bool, interrupted: bool = False, stderr: str = "") -> None:
        msg = conv.tool_result(call, output, exit_code, is_error, interrupted, stderr)
        self.state["messages"].append(msg)
        self.session.emit("tool.result", result_event(turn, msg))

    def _finish(self, turn: int, text: str) -> bool:
        """Settle the turn as finished (lock held); False when it is not live."""
        if self._live(turn) is None:
            return False
        self.session.emit("turn.finished", {"turn": turn, "text": text})
        self.state["current"] = None
        self.session.commit()
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
            self.session.emit("tool.result", result_event(turn, msg))

    def _hook(self, name: str, env: dict, extra: dict):
        if not self.hooks.has(name):
            return None
        verdict = self.hooks.run(name, env)
        with self.session.lock:
            self.session.emit("hook.verdict", verdict.as_event(**extra))
            self.session.commit()
        return verdict


def result_event(turn: int | None, msg: dict) -> dict:
    data = {"turn": turn, "tool_call_id": msg["tool_call_id"], "name": msg["name"],
            "output": msg["output"], "exit_code": msg["exit_code"], "is_error": msg["is_error"]}
    if msg.get("interrupted"):
        data["interrupted"] = True
    if msg.get("stderr"):
        data["stderr"] = msg["stderr"]  # apart from output (older transcripts: combined)
    return data
