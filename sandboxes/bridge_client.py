"""An asyncio client for the bridge's unix socket (docs/BRIDGE.md).

JSON lines: one request line, exactly one answer line, in order per
connection. A client that long-polls ``events`` should use a connection of its
own, so other ops are not stuck behind the poll; :class:`BridgeClient` is one
connection, and the driver keeps two.

    client = await BridgeClient.connect(path, retry_for=15)
    status = await client.status()          # a protocol.Status
    await client.prompt("hello", command_id="42")
    await client.close()

Each op has a typed method that sends a request built with
sandboxes/bridge/protocol.py and parses the answer with it; ``request(op,
**fields)`` is the untyped way under them. What the bridge answers comes from
inside a sandbox and is checked before anyone reads it.

Errors, all :class:`BridgeError` (a ``sandboxes.errors.SandboxError``):

- :class:`BridgeRequestError`: the bridge answered ``ok: false`` (``code``,
  ``message``, ``extra`` such as ``head`` or ``session_id``; ``info`` typed);
- :class:`BridgeUnavailable`: the socket cannot be reached, the connection was
  lost, or no answer came in time (the request may or may not have been acted
  on); the client is closed after it;
- :class:`BridgeProtocolError` (a BridgeUnavailable): the answer breaks the
  protocol (not JSON, out of order, a field of the wrong type or out of
  bounds; ``field`` names it). The client is closed: treat the bridge as one
  that does not answer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

from sandboxes.bridge.protocol import (
    MAX_EVENTS,
    MAX_LINE,
    MAX_SOCKET_PATH,
    AbortAnswer,
    AckAnswer,
    AckRequest,
    ErrorCode,
    ErrorInfo,
    EventsPage,
    EventsRequest,
    Op,
    PauseAnswer,
    PromptAnswer,
    PromptRequest,
    ProtocolError,
    ReplyAnswer,
    ReplyRequest,
    SeedAnswer,
    SeedRequest,
    ShutdownAnswer,
    Status,
    SteerAnswer,
    SteerRequest,
    decode_line,
    encode_line,
    parse_answer,
)
from sandboxes.errors import SandboxError

#: How long an op waits for its answer unless told otherwise.
DEFAULT_TIMEOUT = 30.0
#: ``events`` waits ``wait`` seconds at the bridge; its answer gets this much more.
EVENTS_SLACK = 15.0
#: Sending the same request again gets the same refusal (the request or the
#: bridge's state must change first). ``internal`` and codes this host does not
#: know may pass.
PERMANENT_CODES = frozenset({
    ErrorCode.BAD_JSON, ErrorCode.BAD_REQUEST, ErrorCode.UNKNOWN_OP, ErrorCode.NO_TURN,
    ErrorCode.NOT_FRESH, ErrorCode.CURSOR_PRUNED, ErrorCode.CURSOR_AHEAD, ErrorCode.BAD_ACK,
    ErrorCode.UNKNOWN_REQUEST,
})


class BridgeError(SandboxError):
    """Root of the bridge client's errors: ``code``, ``message``, ``extra``."""

    code = "bridge_error"

    def __init__(self, message: str, code: str | None = None, *, extra: dict | None = None,
                 permanent: bool | None = None):
        super().__init__(message, permanent)
        if code is not None:
            self.code = code
        self.extra = dict(extra or {})


class BridgeUnavailable(BridgeError):
    """The socket does not answer, or the connection was lost mid-request."""

    code = "unavailable"


class BridgeProtocolError(BridgeUnavailable):
    """The bridge answered something the protocol does not allow (``field``)."""

    code = "protocol_error"

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class BridgeRequestError(BridgeError):
    """The bridge answered ``ok: false`` with ``error.code``."""

    def __init__(self, info: ErrorInfo):
        super().__init__(info.message, str(info.code), extra=info.extra,
                         permanent=info.code in PERMANENT_CODES)
        self.info = info


class BridgeClient:
    """One connection to one bridge. Requests are serialised on it."""

    _ids = itertools.count(1)

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.path = path
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._broken = False

    @classmethod
    async def connect(cls, path: str, *, retry_for: float = 0.0, interval: float = 0.2) -> BridgeClient:
        """Connect, retrying for up to ``retry_for`` seconds while the socket is
        absent or refuses (a bridge that is still starting)."""
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise BridgeUnavailable(f"socket path {path!r} is longer than {MAX_SOCKET_PATH} bytes",
                                    code="path_too_long", permanent=True)
        deadline = time.monotonic() + retry_for
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
                return cls(path, reader, writer)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise BridgeUnavailable(f"bridge at {path} does not answer: {exc}") from exc
                await asyncio.sleep(interval)

    @property
    def closed(self) -> bool:
        return self._broken or self._writer.is_closing()

    # --- typed ops (docs/BRIDGE.md "Protocol") ------------------------------------------------
    async def status(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> Status:
        return await self._call(Op.STATUS, Status, {}, timeout)

    async def events(self, after: int = 0, *, wait: float = 0.0, limit: int = MAX_EVENTS,
                     timeout: float | None = None) -> EventsPage:
        """The events with ``bseq > after``, waiting up to ``wait`` s for one.
        ``timeout`` defaults to ``wait`` + EVENTS_SLACK. The page is checked to
        start above ``after`` and to hold at most ``limit`` events."""
        ask = EventsRequest(after, wait, limit)
        if timeout is None:
            timeout = wait + EVENTS_SLACK
        page = await self._call(Op.EVENTS, EventsPage, ask.to_wire(), timeout)
        await self._checked(Op.EVENTS, lambda: page.check_answers(ask))
        return page

    async def ack(self, through: int, *, timeout: float | None = DEFAULT_TIMEOUT) -> AckAnswer:
        return await self._call(Op.ACK, AckAnswer, AckRequest(through).to_wire(), timeout)

    async def prompt(self, text: str, command_id: str | None = None, *,
                     timeout: float | None = DEFAULT_TIMEOUT) -> PromptAnswer:
        fields = PromptRequest(text, command_id).to_wire()
        return await self._call(Op.PROMPT, PromptAnswer, fields, timeout)

    async def steer(self, text: str, command_id: str | None = None, *,
                    timeout: float | None = DEFAULT_TIMEOUT) -> SteerAnswer:
        """BridgeRequestError ``no_turn`` when no turn is running."""
        fields = SteerRequest(text, command_id).to_wire()
        return await self._call(Op.STEER, SteerAnswer, fields, timeout)

    async def abort(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> AbortAnswer:
        return await self._call(Op.ABORT, AbortAnswer, {}, timeout)

    async def pause(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> PauseAnswer:
        return await self._call(Op.PAUSE, PauseAnswer, {}, timeout)

    async def unpause(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> PauseAnswer:
        return await self._call(Op.UNPAUSE, PauseAnswer, {}, timeout)

    async def reply(self, request_id: str, result: Any = None, *, error: Any = None,
                    timeout: float | None = DEFAULT_TIMEOUT) -> ReplyAnswer:
        """Answer a ``request.*`` event: with ``error`` (``{"code", "message"}``)
        when given, else with ``result`` (any JSON, None included)."""
        fields = ReplyRequest(request_id, result, error).to_wire()
        return await self._call(Op.REPLY, ReplyAnswer, fields, timeout)

    async def seed(self, messages: list, turns: int | None = None, *,
                   timeout: float | None = DEFAULT_TIMEOUT) -> SeedAnswer:
        fields = SeedRequest(messages, turns).to_wire()
        return await self._call(Op.SEED, SeedAnswer, fields, timeout)

    async def shutdown(self, *, timeout: float | None = DEFAULT_TIMEOUT) -> ShutdownAnswer:
        return await self._call(Op.SHUTDOWN, ShutdownAnswer, {}, timeout)

    async def _call(self, op: Op, answer_type, fields: dict, timeout: float | None):
        answer = await self.request(op, timeout=timeout, **fields)
        return await self._checked(op, lambda: answer_type.from_wire(answer))

    async def _checked(self, op: Op, parse):
        """``parse()``, or a closed client and BridgeProtocolError when it fails."""
        try:
            return parse()
        except ProtocolError as exc:
            await self._break()
            raise BridgeProtocolError(f"{op}: the bridge answered badly: {exc}"[:1000],
                                      exc.field) from exc

    # --- the wire ----------------------------------------------------------------------------
    async def request(self, op: str, *, timeout: float | None = DEFAULT_TIMEOUT, **fields) -> dict:
        """Send one op and return the answer's fields (without ``id``/``ok``).
        Raises BridgeRequestError on ``ok: false``; BridgeUnavailable on
        connection loss or timeout, BridgeProtocolError on an answer that breaks
        the protocol (after either, this client is closed)."""
        if self.closed:
            raise BridgeUnavailable(f"connection to {self.path} is closed")
        rid = next(self._ids)
        line = encode_line({"op": op, "id": rid, **fields})
        if len(line) > MAX_LINE:
            raise BridgeError(f"{op}: the request is {len(line)} bytes; the bridge reads "
                              f"lines of at most {MAX_LINE}", "request_too_large", permanent=True)
        raw = await self._exchange(op, line, timeout)
        answer = await self._checked(op, lambda: parse_answer(decode_line(raw), rid))
        if isinstance(answer, ErrorInfo):
            raise BridgeRequestError(answer)
        return answer

    async def _exchange(self, op: str, line: bytes, timeout: float | None) -> bytes:
        """Write one line and read the next one (connection-level failures only)."""
        async with self._lock:
            try:
                self._writer.write(line)
                await self._writer.drain()
                raw = await asyncio.wait_for(self._reader.readline(), timeout)
            except TimeoutError as exc:  # before OSError, its base class
                await self._break()
                raise BridgeUnavailable(f"{op}: no answer within {timeout} s") from exc
            except ValueError as exc:  # readline past the StreamReader's limit (MAX_LINE)
                await self._break()
                raise BridgeProtocolError(f"{op}: the answer is longer than {MAX_LINE} bytes",
                                          "line") from exc
            except (OSError, asyncio.IncompleteReadError) as exc:
                await self._break()
                raise BridgeUnavailable(f"{op}: connection to the bridge lost: {exc}") from exc
            except asyncio.CancelledError:
                # An answer may still come for this id: the connection's order is lost.
                await self._break()
                raise
        if not raw:
            await self._break()
            raise BridgeUnavailable(f"{op}: the bridge closed the connection")
        return raw

    async def _break(self) -> None:
        self._broken = True
        self._writer.close()

    async def close(self) -> None:
        self._broken = True
        self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 2)
        except (TimeoutError, OSError):
            pass
