"""The Pi harness: turns run by ``pi --mode rpc`` (pi_rpc.py), Pi's events
turned into the bridge's facts.

| Pi | fact |
|---|---|
| (the prompt is sent) | ``turn.started``, ``message.user`` |
| ``message_update`` text_delta | coalesced ``message.delta`` |
| ``message_end`` assistant | ``message.assistant`` (its text), ``tool.dispatched`` per tool call (Pi's id) |
| ``tool_execution_end`` | ``tool.result`` (exit code from Pi's bash output) |
| ``message_end`` user after the prompt | ``steer.delivered`` |
| ``agent_end`` | ``turn.finished`` |
| Pi exits mid-turn | ``harness.exited``, ``turn.interrupted`` (reason ``harness_exited``) |

Steer is Pi's ``steer``; abort settles the turn at once (as the built-in
harness does) and sends Pi's ``abort``, and the next prompt waits until Pi
is idle again. Pause holds queued prompts here and model calls at the gateway.
Pi's session file (``HOME/.alineo/pi/session.jsonl``) is in the home, so a
turn checkpoint carries it; a restarted bridge starts Pi on it again.
"""

from __future__ import annotations

import logging
import os

from . import conversation as conv
from .harness import Harness
from .hooks import Hooks
from .pi_rpc import PiCommand, PiProcess, exit_code_of, text_of, tool_calls_of
from .pi_session import write_session
from .session import Session

log = logging.getLogger("bridge")

#: How long an aborted prompt may take to end before Pi is restarted.
ABORT_GRACE_S = 10.0


class PiHarness(Harness):
    name = "pi"

    def __init__(self, session: Session, hooks: Hooks, label: str, command: PiCommand,
                 run_dir: str):
        super().__init__(session, hooks, label)
        self.command = command
        self.log_path = os.path.join(run_dir, "pi.log")
        self.pi: PiProcess | None = None
        self.busy = False  # Pi runs a prompt (until its agent_end)
        self._finished: set[int] = set()

    # --- the harness's half ------------------------------------------------------------
    def _cancel_handle(self):
        return self.pi

    def _cancel_running(self, handle, reason: str) -> None:
        if handle is not None:
            handle.send({"type": "abort"})

    def _deliver_steer(self, text: str) -> None:
        with self.session.lock:
            pi = self.pi if self.busy else None
        if pi is not None:
            pi.send({"type": "steer", "message": text})
        # else Pi is between our prompt and its agent_start, or done: agent_end resends

    def _after_seed(self, messages: list[dict]) -> None:
        write_session(self.command.session_path, messages, self.command.home)

    def resume(self, resumed: bool, source: str) -> None:
        super().resume(resumed, source)
        with self.session.lock:
            if self.state["messages"] and not self.command.session_path.exists():
                # Pi was killed before its file existed (during the first model
                # call of a session): its conversation comes from ours, once.
                write_session(self.command.session_path, self.state["messages"], self.command.home)
                self.session.emit("harness.session_written",
                                  {"harness": self.name, "messages": len(self.state["messages"])})
                self.session.commit()

    def stop(self) -> None:
        super().stop()
        with self.session.lock:
            pi, self.pi = self.pi, None
        if pi is not None:
            pi.close()

    # --- the turn loop ----------------------------------------------------------------
    def _after_turn(self, turn: int) -> None:
        if turn in self._finished:
            self._finished.discard(turn)
            self._hook("stop", {"ALINEO_TURN": str(turn)}, {"turn": turn})

    def _run_turn(self, item: dict) -> None:
        turn, text = item["turn"], item["text"]
        with self.session.lock:
            pi = self._ensure_pi()
            self.busy = True
            self._live(turn)["pi_user_seen"] = False
            self._reset_delta()
        pi.send({"id": f"prompt-{turn}", "type": "prompt", "message": text})
        with self.session.lock:
            self.session.changed.wait_for(lambda: self._live(turn) is None or self.stopping)
            if self.stopping:
                return
            # Aborted: the next prompt waits until Pi has ended this one.
            idle = self.session.changed.wait_for(lambda: not self.busy or self.pi is not pi,
                                                 timeout=ABORT_GRACE_S)
            if idle:
                return
            self.pi = None
            self.busy = False
        log.warning("pi did not end an aborted prompt in %.0f s: restarting it", ABORT_GRACE_S)
        pi.close(timeout=1)

    def _ensure_pi(self) -> PiProcess:
        """The running Pi, started on the session file when there is none (lock held)."""
        if self.pi is None or not self.pi.alive():
            self.pi = PiProcess(self.command, self.log_path, self._on_event, self._on_exit)
            self.busy = False
        return self.pi

    # --- Pi's events (the reader thread) ---------------------------------------------
    def _on_exit(self, pi: PiProcess, code: int | None) -> None:
        with self.session.lock:
            if pi is not self.pi or self.stopping:
                return
            self.pi, self.busy = None, False
            self.session.emit("harness.exited", {"harness": self.name, "exit_code": code,
                                                 "log_tail": _tail(self.log_path)})
            cur = self.state["current"]
            if cur is not None:
                self._settle(cur, "harness_exited")
            self.session.commit()

    def _on_event(self, pi: PiProcess, event: dict) -> None:
        kind = event.get("type")
        with self.session.lock:
            if pi is not self.pi:
                return
            if kind == "agent_end":
                self._agent_end(pi)
                return
            cur = self.state["current"]
            if cur is None or "pi_user_seen" not in cur:
                return  # an aborted prompt's tail, or not ours
            turn = cur["turn"]
            if kind == "message_update":
                delta = event.get("assistantMessageEvent") or {}
                if delta.get("type") == "text_delta" and isinstance(delta.get("delta"), str):
                    self._delta(turn, delta["delta"])
            elif kind == "message_end":
                self._message_end(cur, event.get("message") or {})
            elif kind == "tool_execution_end":
                self._tool_end(turn, event)
            elif kind == "response" and event.get("success") is False:
                self._refused(cur, event)

    def _agent_end(self, pi: PiProcess) -> None:
        self.busy = False
        cur = self.state["current"]
        if cur is not None and cur["steers"]:
            # Steers that reached Pi after it stopped streaming: one more prompt.
            self.busy = True
            pi.send({"type": "prompt", "message": cur["steers"][0]})
            for more in cur["steers"][1:]:
                pi.send({"type": "prompt", "message": more, "streamingBehavior": "steer"})
        elif cur is not None and "pi_user_seen" in cur:
            if self._finish(cur["turn"], cur["texts"][-1] if cur["texts"] else ""):
                self._finished.add(cur["turn"])
        self.session.changed.notify_all()

    def _message_end(self, cur: dict, message: dict) -> None:
        turn, role = cur["turn"], message.get("role")
        if role == "user":
            if not cur["pi_user_seen"]:
                cur["pi_user_seen"] = True  # the prompt, journaled at the turn's start
                return
            text = text_of(message.get("content"))
            if text in cur["steers"]:
                cur["steers"].remove(text)
            self.state["messages"].append(conv.user(text, "steer"))
            self.session.emit("steer.delivered", {"turn": turn, "text": text})
            self.session.commit()
        elif role == "assistant":
            self._assistant(cur, message)

    def _assistant(self, cur: dict, message: dict) -> None:
        stop = message.get("stopReason")
        if stop == "aborted":
            return
        turn = cur["turn"]
        text, calls = text_of(message.get("content")), tool_calls_of(message.get("content"))
        cur["step"] += 1
        self.state["messages"].append(conv.assistant(text, calls))
        cur["partial"] = ""
        self._reset_delta()
        if text:
            cur["texts"].append(text)
            self.session.emit("message.assistant", {"turn": turn, "text": text})
        for c in calls:
            self.session.emit("tool.dispatched", {"turn": turn, "tool_call_id": c["id"],
                                                  "name": c["name"], "input": c["input"]})
        if stop == "error":
            self.session.emit("model.error", {"turn": turn, "message": str(
                message.get("errorMessage") or "the model call failed")[:2000]})
            self._settle(cur, "model_error")
        self.session.commit()

    def _tool_end(self, turn: int, event: dict) -> None:
        call_id = event.get("toolCallId")
        if not any(c["id"] == call_id for c in conv.dangling_calls(self.state["messages"])):
            return  # not a call of this turn's (or already closed by an abort)
        result = event.get("result") or {}
        output, is_error = text_of(result.get("content")), bool(event.get("isError"))
        call = {"id": call_id, "name": str(event.get("toolName") or "")}
        self._record_result(turn, call, output, exit_code_of(output, is_error), is_error)
        self.session.commit()

    def _refused(self, cur: dict, event: dict) -> None:
        if event.get("command") == "prompt":
            self.busy = False
            self.session.emit("bridge.error", {"turn": cur["turn"], "message": str(
                event.get("error") or "pi refused the prompt")[:2000]})
            self._settle(cur, "harness_error")
            self.session.commit()
        else:
            log.warning("pi refused %s: %s", event.get("command"), event.get("error"))


def _tail(path: str, limit: int = 2000) -> str:
    """The end of Pi's stderr log: why it exited, for the transcript."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
