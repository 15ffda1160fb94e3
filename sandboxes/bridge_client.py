"""An asyncio client for the bridge's unix socket (docs/BRIDGE.md).

JSON lines: one request line, exactly one answer line, in order per
connection. A client that long-polls ``events`` should use a connection of its
own, so other ops are not stuck behind the poll; :class:`BridgeClient` is one
connection, and the driver keeps two.

    client = await BridgeClient.connect(path, retry_for=15)
    status = await client.request("status")
    await client.close()

Errors: :class:`BridgeRequestError` when the bridge answers ``ok: false``
(``code``, ``message`` and the extra fields, e.g. ``head`` or ``session_id``),
:class:`BridgeUnavailable` when the socket cannot be reached or the connection
is lost (the answer may or may not have been acted on).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time

#: AF_UNIX sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: A seed request (or a long events page) may be large.
MAX_LINE = 64 * 1024 * 1024


class BridgeError(Exception):
    """Root of the bridge client's errors."""

    code = "bridge_error"

    def __init__(self, message: str, code: str | None = None, **extra):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.extra = extra


class BridgeUnavailable(BridgeError):
    """The socket does not answer, or the connection was lost mid-request."""

    code = "unavailable"


class BridgeRequestError(BridgeError):
    """The bridge answered ``ok: false`` with ``error.code``."""


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
                                    code="path_too_long")
        deadline = time.monotonic() + retry_for
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE)
                return cls(path, reader, writer)
            except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise BridgeUnavailable(f"bridge at {path} does not answer: {exc}") from exc
                await asyncio.sleep(interval)

    @property
    def closed(self) -> bool:
        return self._broken or self._writer.is_closing()

    async def request(self, op: str, *, timeout: float | None = 30.0, **fields) -> dict:
        """Send one op and return the answer's fields (without ``id``/``ok``).
        Raises BridgeRequestError on ``ok: false``, BridgeUnavailable on
        connection loss or timeout (after which this client is closed)."""
        if self.closed:
            raise BridgeUnavailable(f"connection to {self.path} is closed")
        rid = next(self._ids)
        line = json.dumps({"op": op, "id": rid, **fields}, ensure_ascii=False).encode("utf-8") + b"\n"
        async with self._lock:
            try:
                self._writer.write(line)
                await self._writer.drain()
                raw = await asyncio.wait_for(self._reader.readline(), timeout)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                await self._break()
                raise BridgeUnavailable(f"{op}: connection to the bridge lost: {exc}") from exc
            except TimeoutError as exc:
                await self._break()
                raise BridgeUnavailable(f"{op}: no answer within {timeout} s") from exc
            except asyncio.CancelledError:
                # An answer may still come for this id: the connection's order is lost.
                await self._break()
                raise
            if not raw:
                await self._break()
                raise BridgeUnavailable(f"{op}: the bridge closed the connection")
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            await self._break()
            raise BridgeUnavailable(f"{op}: the bridge answered a line that is not JSON") from exc
        if not isinstance(answer, dict) or answer.get("id") != rid:
            await self._break()
            raise BridgeUnavailable(f"{op}: answer out of order ({str(answer)[:200]})")
        if not answer.get("ok"):
            error = answer.get("error") or {}
            if not isinstance(error, dict):
                error = {"message": str(error)}
            extra = {k: v for k, v in error.items() if k not in ("code", "message")}
            raise BridgeRequestError(str(error.get("message") or "error"),
                                     code=str(error.get("code") or "error"), **extra)
        return {k: v for k, v in answer.items() if k not in ("id", "ok")}

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
