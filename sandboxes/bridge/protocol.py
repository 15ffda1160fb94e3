"""The bridge's socket protocol: one definition for both ends (docs/BRIDGE.md).

The bridge (inside the sandbox) parses requests and builds answers with these
types; the host (sandboxes/bridge_client.py) builds requests and parses answers
with the same ones. Standard library only (it runs on the sandbox image's
python3 3.11, no packages); with wire.py, the machinery under it, this is all
of the bridge the host imports.

An answer comes from inside a sandbox, so the host parses it strictly:
``from_wire`` checks every field's type and bounds (the ``MAX_*`` constants;
docs/BRIDGE.md "Versions and bounds") and raises one :class:`ProtocolError`
naming the field. Fields it does not know are ignored: the format only grows
(``PROTOCOL_VERSION``; a ``status`` without ``protocol`` comes from a version 1
bridge). Requests are parsed as the bridge always parsed them: same defaults,
same clamping, same error codes. Each message is a frozen dataclass whose
fields name their reader and bounds (wire.message_field); a message overrides
``from_wire``/``to_wire`` only where its shape depends on a value.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .wire import MAX_INT, ProtocolError, decode_line, encode_line  # noqa: F401 - re-exported
from .wire import (
    MISSING,
    Message,
    as_object,
    get,
    is_scalar,
    message_field,
    path,
    read_any,
    read_bool,
    read_int,
    read_ints,
    read_list,
    read_message,
    read_object,
    read_pattern,
    read_str,
    read_strs,
)

#: The version this bridge speaks; versions only ever add fields.
PROTOCOL_VERSION = 1
#: What a ``status`` without a ``protocol`` field means (the first release).
FIRST_VERSION = 1

#: AF_UNIX sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: The file the control plane writes into the run dir once a home it restored
#: is complete; a bridge started with ``--wait-home`` waits for it.
HOME_READY = "home.ready"
#: One line, either way: a request may hold a whole seed conversation.
MAX_LINE = 64 * 1024 * 1024
#: ``events``: the longest long-poll (seconds) and the largest page.
MAX_WAIT = 30.0
MAX_EVENTS = 500
#: The host's journal stores event types of at most 64 characters.
MAX_EVENT_TYPE = 64
#: session_id, command_id, request ids (a tool call id chosen by the model).
MAX_ID = 1024
MAX_NAME = 256
MAX_MESSAGE = 16 * 1024
#: Entries of ``queued`` and ``pending_requests``.
MAX_ITEMS = 10_000
MAX_EXTRA = 16
#: How deep an event's data may nest (tool inputs are the model's JSON).
MAX_DEPTH = 100

_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


class Op(StrEnum):
    PROMPT = "prompt"
    STEER = "steer"
    ABORT = "abort"
    STATUS = "status"
    EVENTS = "events"
    ACK = "ack"
    REPLY = "reply"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    SEED = "seed"
    SHUTDOWN = "shutdown"


class ErrorCode(StrEnum):
    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"
    INTERNAL = "internal"
    NO_TURN = "no_turn"
    NOT_FRESH = "not_fresh"
    CURSOR_PRUNED = "cursor_pruned"
    CURSOR_AHEAD = "cursor_ahead"
    BAD_ACK = "bad_ack"
    UNKNOWN_REQUEST = "unknown_request"


class BridgeState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"


def parse_op(value: object) -> Op | None:
    """The op a request names, or None for an unknown one."""
    try:
        return Op(value)
    except ValueError:
        return None


# --- readers only this protocol has (wire.py has the general ones) ---------------------------


def _text(wire, key, where="", *, default=MISSING) -> str:
    text = wire.get(key)
    if not isinstance(text, str) or not text.strip():
        raise ProtocolError(path(where, key), "must be a non-empty string")
    return text


def _state(wire, key, where="", *, default=MISSING) -> BridgeState:
    value = get(wire, key, where, default)
    if value not in ("idle", "running"):
        raise ProtocolError(path(where, key), "must be idle or running")
    return BridgeState(value)


def _timestamp(wire, key, where="", *, default=MISSING) -> str:
    value = read_str(wire, key, where, limit=64)
    try:
        aware = datetime.datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        aware = False
    if not aware:
        raise ProtocolError(path(where, key), "must be an ISO 8601 time with a time zone")
    return value


def _seconds(wire, key, where="", *, default=MISSING) -> float:
    # As lenient as the bridge always was (float() of what came); NaN never.
    try:
        value = float(wire.get(key) or 0)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ProtocolError(path(where, key), "must be a number of seconds")
    return min(max(value, 0.0), MAX_WAIT)


def _turns(wire, key, where="", *, default=MISSING) -> int | None:
    # As lenient as the bridge always was (int() of what came; 0 or none: count).
    try:
        value = int(wire.get(key) or 0)
    except (TypeError, ValueError, OverflowError):
        value = -1
    if not 0 <= value <= MAX_INT:
        raise ProtocolError(path(where, key), "must be a non-negative integer")
    return value or None


def _page_limit(wire, key, where="", *, default=MISSING) -> int:
    return max(1, min(read_int(wire, key, where, default=default), MAX_EVENTS))


def _extra(wire, key, where="", *, default=MISSING) -> object:
    if key in ("acked", "head"):
        return read_int(wire, key, where)
    if key == "session_id" or isinstance(wire[key], str):
        return read_str(wire, key, where, limit=MAX_ID)
    if not is_scalar(wire[key]):
        raise ProtocolError(path(where, key), "must be a JSON scalar")
    return wire[key]


# --- requests (parsed by the bridge, built by the host) ----------------------------------------


@dataclass(frozen=True)
class PromptRequest(Message):
    text: str = message_field(_text)
    command_id: str | None = message_field(read_str, None, omit=None, limit=MAX_LINE,
                                           nullable=True)


class SteerRequest(PromptRequest):
    """The same fields as a prompt: ``text`` and the idempotency key ``command_id``."""


@dataclass(frozen=True)
class EventsRequest(Message):
    """Clamped as the bridge always clamped it: wait to 0–30 s, limit to 1–500."""

    after: int = message_field(read_int, 0)
    wait: float = message_field(_seconds, 0.0)
    limit: int = message_field(_page_limit, MAX_EVENTS)


@dataclass(frozen=True)
class AckRequest(Message):
    through: int = message_field(read_int, 0)


@dataclass(frozen=True)
class ReplyRequest(Message):
    """The answer to a ``request.*`` event: ``error`` when set, else ``result``
    (any JSON, null included)."""

    request_id: str = message_field(read_str, None, limit=MAX_LINE)
    result: Any = message_field(read_any, None)
    error: Any = message_field(read_any, None)

    @classmethod
    def from_wire(cls, wire: object, where: str = ""):
        if isinstance(wire, dict) and "result" not in wire and "error" not in wire:
            read_str(wire, "request_id", limit=MAX_LINE, default=None)
            raise ProtocolError("result", "or error is required",
                                "reply needs a result or an error")
        return super().from_wire(wire, where)

    def to_wire(self) -> dict:
        if self.error is not None:
            return {"request_id": self.request_id, "error": self.error}
        return {"request_id": self.request_id, "result": self.result}


@dataclass(frozen=True)
class SeedRequest(Message):
    """Neutral messages (checked by the bridge's conversation.validate) and the
    turn count (None: the number of prompts)."""

    messages: list = message_field(read_list, limit=MAX_LINE)
    turns: int | None = message_field(_turns, None, omit=None)


# --- answers (built by the bridge, parsed by the host) ------------------------------------------


@dataclass(frozen=True)
class TurnInfo(Message):
    """The running turn, as ``status`` reports it."""

    turn: int = message_field(read_int, low=1)
    command_id: str | None = message_field(read_str, limit=MAX_ID, nullable=True)
    step: int = message_field(read_int)


@dataclass(frozen=True, kw_only=True)
class Status(Message):
    state: BridgeState = message_field(_state)
    # Absent from bridges older than pause (they cannot be paused).
    paused: bool = message_field(read_bool, False)
    turn: TurnInfo | None = message_field(read_message, message_type=TurnInfo, nullable=True)
    queued: tuple[int, ...] = message_field(read_ints, items=MAX_ITEMS, low=1)
    head: int = message_field(read_int)
    acked: int = message_field(read_int)
    session_id: str = message_field(read_str, limit=MAX_ID)
    model: str = message_field(read_str, limit=MAX_NAME)
    turns: int = message_field(read_int)
    pending_requests: tuple[str, ...] = message_field(read_strs, items=MAX_ITEMS,
                                                      limit=MAX_ID)
    protocol: int = message_field(read_int, FIRST_VERSION, low=1)

    def check(self) -> None:
        if (self.turn is None) != (self.state is BridgeState.IDLE):
            raise ProtocolError("turn", "must be set exactly when the state is running")
        if self.acked > self.head:
            raise ProtocolError("acked", "must not be past the head")


@dataclass(frozen=True)
class BridgeEvent(Message):
    """``{"bseq", "type", "ts", "data"}`` (the event types: docs/BRIDGE.md)."""

    bseq: int = message_field(read_int, low=1)
    type: str = message_field(read_pattern, pattern=_EVENT_TYPE, limit=MAX_EVENT_TYPE,
                              what="a dotted lower-case name")
    ts: str = message_field(_timestamp)
    data: dict = message_field(read_object, depth=MAX_DEPTH)


#: What the host records in place of an event it cannot take (its bseq still counts).
REFUSED_EVENT = "bridge.event_refused"


def _events(wire, key, where="", *, default=MISSING) -> tuple[BridgeEvent, ...]:
    """Each event parsed strictly; one that breaks a rule but has a good bseq
    becomes a ``bridge.event_refused {field, reason}`` in its place, so the
    host journals that it refused it — and the cursor moves on past it
    instead of stalling on it forever."""
    out = []
    for i, raw in enumerate(read_list(wire, key, where, default=default, limit=MAX_EVENTS)):
        at = f"{path(where, key)}[{i}]"
        try:
            out.append(BridgeEvent.from_wire(raw, at))
        except ProtocolError as exc:
            bseq = read_int(as_object(raw, at), "bseq", at, low=1)  # a bad bseq: the page is bad
            now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
            out.append(BridgeEvent(bseq, REFUSED_EVENT, now,
                                   {"field": exc.field, "reason": exc.reason[:MAX_MESSAGE]}))
    return tuple(out)


@dataclass(frozen=True)
class EventsPage(Message):
    events: tuple[BridgeEvent, ...] = message_field(_events)
    head: int = message_field(read_int)
    session_id: str = message_field(read_str, limit=MAX_ID)

    def check(self) -> None:
        # A healthy bridge numbers its events 1, 2, 3 … with no gaps (docs/BRIDGE.md).
        # A repeat or a step back is a broken page; a gap (a session file edited
        # from inside the sandbox) is not refused here: the relay journals it as
        # `bridge.events_lost`, so the loss is on the record and the cursor moves on.
        for i in range(1, len(self.events)):
            if self.events[i].bseq <= self.events[i - 1].bseq:
                raise ProtocolError(f"events[{i}].bseq", "must be above the one before it")
        if self.events and self.events[-1].bseq > self.head:
            raise ProtocolError("head", "must not be below the last event's bseq")

    def check_answers(self, request: EventsRequest) -> None:
        """Raise ProtocolError unless this page answers ``request``: it starts
        above the cursor (a gap is the relay's to journal) and holds no more
        than was asked for."""
        if self.head < request.after:
            raise ProtocolError("head", "must not be below the cursor")
        if self.events and self.events[0].bseq <= request.after:
            raise ProtocolError("events[0].bseq", f"must be above the cursor {request.after}")
        if len(self.events) > max(1, min(request.limit, MAX_EVENTS)):
            raise ProtocolError("events", f"has more than the {request.limit} asked for")


@dataclass(frozen=True)
class PromptAnswer(Message):
    """``turn``, ``queued``, ``position``; or ``turn``, ``duplicate: true`` for a
    command id seen before (then queued/position are not sent)."""

    turn: int = message_field(read_int, low=1)
    queued: bool = message_field(read_bool, False)
    position: int = message_field(read_int, 0)
    duplicate: bool = message_field(read_bool, False)

    @classmethod
    def from_wire(cls, wire: object, where: str = ""):
        answer = super().from_wire(wire, where)
        if not answer.duplicate:  # a fresh prompt always says where it queued
            read_bool(wire, "queued")
            read_int(wire, "position")
        return answer

    def to_wire(self) -> dict:
        if self.duplicate:
            return {"turn": self.turn, "duplicate": True}
        return {"turn": self.turn, "queued": self.queued, "position": self.position}


@dataclass(frozen=True)
class SteerAnswer(Message):
    turn: int = message_field(read_int, low=1)
    duplicate: bool = message_field(read_bool, False, omit=False)


@dataclass(frozen=True)
class AbortAnswer(Message):
    """``aborted: false`` when no turn ran; else the turn that was settled."""

    aborted: bool = message_field(read_bool)
    turn: int | None = message_field(read_int, None, omit=None, low=1, nullable=True)

    def check(self) -> None:
        if self.aborted and self.turn is None:
            raise ProtocolError("turn", "is required when aborted is true")


@dataclass(frozen=True)
class AckAnswer(Message):
    acked: int = message_field(read_int)


@dataclass(frozen=True)
class ReplyAnswer(Message):
    request_id: str = message_field(read_str, limit=MAX_ID)


@dataclass(frozen=True)
class PauseAnswer(Message):
    """The answer of both ``pause`` and ``unpause``."""

    paused: bool = message_field(read_bool)


@dataclass(frozen=True)
class SeedAnswer(Message):
    messages: int = message_field(read_int)
    turns: int = message_field(read_int)


@dataclass(frozen=True)
class ShutdownAnswer(Message):
    stopping: bool = message_field(read_bool)


#: The typed answer of each op.
ANSWERS = {Op.PROMPT: PromptAnswer, Op.STEER: SteerAnswer, Op.ABORT: AbortAnswer,
           Op.STATUS: Status, Op.EVENTS: EventsPage, Op.ACK: AckAnswer, Op.REPLY: ReplyAnswer,
           Op.PAUSE: PauseAnswer, Op.UNPAUSE: PauseAnswer, Op.SEED: SeedAnswer,
           Op.SHUTDOWN: ShutdownAnswer}


# --- errors and envelopes ------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorInfo(Message):
    """``{"code", "message", ...extra}``: what an ``ok: false`` answer carries.
    ``code`` is kept as a string: a newer bridge may send codes not in ErrorCode."""

    code: str
    message: str
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_wire(cls, wire: object, where: str = "error"):
        wire = as_object(wire, where)
        extra = {k: v for k, v in wire.items() if k not in ("code", "message")}
        if len(extra) > MAX_EXTRA or any(len(k) > 64 for k in extra):
            raise ProtocolError(where, f"must have at most {MAX_EXTRA} short extra fields")
        code = read_pattern(wire, "code", where, pattern=_CODE, limit=64, what="a snake_case name")
        return cls(code, read_str(wire, "message", where, limit=MAX_MESSAGE),
                   {k: _extra(extra, k, where) for k in extra})

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message, **self.extra}

    @property
    def head(self) -> int | None:
        return self.extra.get("head")

    @property
    def acked(self) -> int | None:
        return self.extra.get("acked")

    @property
    def session_id(self) -> str | None:
        return self.extra.get("session_id")


def ok_answer(rid: object, answer: Message) -> dict:
    """``{"id", "ok": true, ...fields}`` for a typed answer."""
    return {"id": rid, "ok": True, **answer.to_wire()}


def error_answer(rid: object, error: ErrorInfo) -> dict:
    return {"id": rid, "ok": False, "error": error.to_wire()}


def parse_answer(wire: object, rid: int) -> dict | ErrorInfo:
    """The fields of the answer to request ``rid`` (without ``id``/``ok``), or
    the error it carries."""
    wire = as_object(wire, "answer")
    if wire.get("id") != rid or isinstance(wire.get("id"), bool):
        raise ProtocolError("id", f"must be {rid}, the request's (the answer is out of order)")
    if not read_bool(wire, "ok"):
        return ErrorInfo.from_wire(get(wire, "error", "", MISSING))
    return {k: v for k, v in wire.items() if k not in ("id", "ok")}
