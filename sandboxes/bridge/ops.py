"""The protocol's operations: one handler per op, each returning the response
fields or raising OpError(code, message). Transport lives in server.py."""

from __future__ import annotations

from .requests import Requests
from .runner import Busy, Runner
from .session import Session

MAX_WAIT = 30.0
DEFAULT_LIMIT = 500


class OpError(Exception):
    def __init__(self, code: str, message: str, **extra):
        super().__init__(message)
        self.code = code
        self.extra = extra


class Ops:
    def __init__(self, session: Session, runner: Runner, requests: Requests, on_shutdown):
        self.session = session
        self.runner = runner
        self.requests = requests
        self.on_shutdown = on_shutdown
        self.shutdown_requested = False

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            raise OpError("unknown_op", f"unknown op {op!r}")
        try:
            return fn(req)
        except Busy as exc:
            raise OpError(exc.code, str(exc)) from None
        except ValueError as exc:
            raise OpError("bad_request", str(exc)) from None

    # --- turns --------------------------------------------------------------------------
    def op_prompt(self, req: dict) -> dict:
        text = _text(req)
        command_id = req.get("command_id")
        if command_id is not None and not isinstance(command_id, str):
            raise OpError("bad_request", "command_id must be a string")
        return self.runner.enqueue(text, command_id)

    def op_steer(self, req: dict) -> dict:
        command_id = req.get("command_id")
        if command_id is not None and not isinstance(command_id, str):
            raise OpError("bad_request", "command_id must be a string")
        return self.runner.steer(_text(req), command_id)

    def op_abort(self, req: dict) -> dict:
        return self.runner.abort("aborted")

    def op_pause(self, req: dict) -> dict:
        return self.runner.pause(True)

    def op_unpause(self, req: dict) -> dict:
        return self.runner.pause(False)

    def op_seed(self, req: dict) -> dict:
        return self.runner.seed(req.get("messages"), req.get("turns"))

    def op_status(self, req: dict) -> dict:
        return self.runner.status()

    def op_shutdown(self, req: dict) -> dict:
        # Acted on by the server once this answer is written (after_response).
        self.shutdown_requested = True
        return {"stopping": True}

    def after_response(self) -> None:
        if self.shutdown_requested:
            self.on_shutdown()

    # --- the event cursor ---------------------------------------------------------------
    def op_events(self, req: dict) -> dict:
        after = _int(req, "after", 0)
        wait = min(max(float(req.get("wait") or 0), 0.0), MAX_WAIT)
        limit = max(1, min(_int(req, "limit", DEFAULT_LIMIT), DEFAULT_LIMIT))
        with self.session.lock:
            self._check_cursor(after)
            if wait and self.session.head() <= after:
                self.session.wait_for_events(after, wait)
                self._check_cursor(after)  # another client may have acked meanwhile
            events = self.session.events_after(after, limit)
            return {"events": events, "head": self.session.head(),
                    "session_id": self.session.state["session_id"]}

    def _check_cursor(self, after: int) -> None:
        """A cursor must point into what is kept: events below acked+1 are
        gone, and a cursor past the head belongs to another session (a rebuilt
        bridge starts again at 1) — both are errors, never silent gaps."""
        state = self.session.state
        if after < state["acked"]:
            raise OpError("cursor_pruned",
                          f"events up to {state['acked']} were acknowledged and dropped",
                          acked=state["acked"], session_id=state["session_id"])
        if after > self.session.head():
            raise OpError("cursor_ahead", f"cursor {after} is past the head {self.session.head()}",
                          head=self.session.head(), session_id=state["session_id"])

    def op_ack(self, req: dict) -> dict:
        through = _int(req, "through", 0)
        with self.session.lock:
            if through > self.session.head():
                raise OpError("bad_ack", f"cannot ack {through}: the head is {self.session.head()}")
            self.session.ack(through)
            self.session.commit()
            return {"acked": self.session.state["acked"]}

    # --- answers to request.spawn / request.memory --------------------------------------
    def op_reply(self, req: dict) -> dict:
        request_id = req.get("request_id")
        if not isinstance(request_id, str):
            raise OpError("bad_request", "request_id must be a string")
        if "result" not in req and "error" not in req:
            raise OpError("bad_request", "reply needs a result or an error")
        if not self.requests.reply(request_id, req.get("result"), req.get("error")):
            raise OpError("unknown_request", f"no tool is waiting for {request_id!r}")
        return {"request_id": request_id}


def _text(req: dict) -> str:
    text = req.get("text")
    if not isinstance(text, str) or not text.strip():
        raise OpError("bad_request", "text must be a non-empty string")
    return text


def _int(req: dict, name: str, default: int) -> int:
    value = req.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OpError("bad_request", f"{name} must be a non-negative integer")
    return value
