"""The protocol's operations: one handler per op (protocol.Op), each reading its
request through protocol.py and returning a typed answer, or raising
OpError(code, message). Transport lives in server.py."""

from __future__ import annotations

from .protocol import (
    AckAnswer,
    AckRequest,
    BridgeEvent,
    ErrorCode,
    ErrorInfo,
    EventsPage,
    EventsRequest,
    Op,
    PromptRequest,
    ReplyAnswer,
    ReplyRequest,
    SeedRequest,
    ShutdownAnswer,
    SteerRequest,
    parse_op,
)
from .requests import Requests
from .harness import Busy, Harness
from .session import Session


class OpError(Exception):
    def __init__(self, code: str, message: str, **extra):
        super().__init__(message)
        self.code = code
        self.extra = extra

    def info(self) -> ErrorInfo:
        return ErrorInfo(self.code, str(self), self.extra)


class Ops:
    def __init__(self, session: Session, runner: Harness, requests: Requests, on_shutdown):
        self.session = session
        self.runner = runner
        self.requests = requests
        self.on_shutdown = on_shutdown
        self.shutdown_requested = False
        self._handlers = {op: getattr(self, f"op_{op.value}") for op in Op}

    def handle(self, req: dict):
        """The typed answer to one request (OpError when it is refused)."""
        op = parse_op(req.get("op"))
        if op is None:
            raise OpError(ErrorCode.UNKNOWN_OP, f"unknown op {req.get('op')!r}")
        try:
            return self._handlers[op](req)
        except Busy as exc:
            raise OpError(exc.code, str(exc)) from None
        except ValueError as exc:  # protocol.ProtocolError names the field
            raise OpError(ErrorCode.BAD_REQUEST, str(exc)) from None

    # --- turns --------------------------------------------------------------------------
    def op_prompt(self, req: dict):
        prompt = PromptRequest.from_wire(req)
        return self.runner.enqueue(prompt.text, prompt.command_id)

    def op_steer(self, req: dict):
        steer = SteerRequest.from_wire(req)
        return self.runner.steer(steer.text, steer.command_id)

    def op_abort(self, req: dict):
        return self.runner.abort("aborted")

    def op_pause(self, req: dict):
        return self.runner.pause(True)

    def op_unpause(self, req: dict):
        return self.runner.pause(False)

    def op_seed(self, req: dict):
        seed = SeedRequest.from_wire(req)
        return self.runner.seed(seed.messages, seed.turns)

    def op_status(self, req: dict):
        return self.runner.status()

    def op_shutdown(self, req: dict) -> ShutdownAnswer:
        # Acted on by the server once this answer is written (after_response).
        self.shutdown_requested = True
        return ShutdownAnswer(stopping=True)

    def after_response(self) -> None:
        if self.shutdown_requested:
            self.on_shutdown()

    # --- the event cursor ---------------------------------------------------------------
    def op_events(self, req: dict) -> EventsPage:
        cursor = EventsRequest.from_wire(req)
        with self.session.lock:
            self._check_cursor(cursor.after)
            if cursor.wait and self.session.head() <= cursor.after:
                self.session.wait_for_events(cursor.after, cursor.wait)
                self._check_cursor(cursor.after)  # another client may have acked meanwhile
            events = self.session.events_after(cursor.after, cursor.limit)
            return EventsPage(tuple(BridgeEvent(e["bseq"], e["type"], e["ts"], e["data"])
                                    for e in events),
                              self.session.head(), self.session.state["session_id"])

    def _check_cursor(self, after: int) -> None:
        """A cursor must point into what is kept: events below acked+1 are
        gone, and a cursor past the head belongs to another session (a rebuilt
        bridge starts again at 1) — both are errors, never silent gaps."""
        state = self.session.state
        if after < state["acked"]:
            raise OpError(ErrorCode.CURSOR_PRUNED,
                          f"events up to {state['acked']} were acknowledged and dropped",
                          acked=state["acked"], session_id=state["session_id"])
        if after > self.session.head():
            raise OpError(ErrorCode.CURSOR_AHEAD,
                          f"cursor {after} is past the head {self.session.head()}",
                          head=self.session.head(), session_id=state["session_id"])

    def op_ack(self, req: dict) -> AckAnswer:
        through = AckRequest.from_wire(req).through
        with self.session.lock:
            if through > self.session.head():
                raise OpError(ErrorCode.BAD_ACK,
                              f"cannot ack {through}: the head is {self.session.head()}")
            self.session.ack(through)
            self.session.commit()
            return AckAnswer(self.session.state["acked"])

    # --- answers to request.spawn / request.memory --------------------------------------
    def op_reply(self, req: dict) -> ReplyAnswer:
        reply = ReplyRequest.from_wire(req)
        if not self.requests.reply(reply.request_id, reply.result, reply.error):
            raise OpError(ErrorCode.UNKNOWN_REQUEST,
                          f"no tool is waiting for {reply.request_id!r}")
        return ReplyAnswer(reply.request_id)
