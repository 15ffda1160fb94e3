"""One gateway listener per sandbox: HTTP over a unix socket in its run dir.

The listener IS the agent's identity: it is made for one agent (its Route)
and every request on its socket is that agent's — never a header, a key or a
model name the sandbox sends. The harness's own ``model`` field is read but
the Route's upstream (the spec's model) answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import anthropic_wire, httpio, openai_wire
from .calls import CallRecord, CallStatus, cost_usd, reply_of, request_hash
from .errors import BadRequest, BudgetExceeded, GatewayError, NotFound, UpstreamError
from .messages import Api, ModelReply, ModelRequest, Usage

log = logging.getLogger(__name__)

#: Connections one sandbox may hold open at once; more are closed unanswered.
MAX_CONNECTIONS = 32
#: Seconds a connection may sit between requests (or in one) before it is closed.
IDLE_S = 600.0
CHUNK = 16
#: How often a held call looks whether its agent was resumed.
HOLD_POLL_S = 0.5


class Journal(Protocol):
    """Where calls become facts (sessions/gateway/journaled.py CallJournal)."""

    async def paused(self) -> bool: ...

    async def completed(self, request_hash: str): ...

    async def record(self, call: CallRecord) -> None: ...

    async def over_budget(self): ...

    async def exceeded(self, refusal) -> None: ...

    async def replayed(self, request_hash: str, found, latency_ms: int) -> None: ...


class Upstream(Protocol):
    label: str

    async def complete(self, request: ModelRequest) -> ModelReply: ...

    def model_ids(self) -> list[str]: ...


@dataclass(frozen=True)
class Route:
    """Who calls through a socket, who answers, where calls are journaled
    (None: not journaled, as in tests of the wire alone) and at what prices."""
    agent_id: str
    upstream: Upstream
    journal: Journal | None = None
    prices: dict | None = None


class GatewayServer:
    def __init__(self, route: Route, socket_path: Path, *, max_body: int, mode: int = 0o600):
        self.route = route
        self.socket_path = Path(socket_path)
        self.max_body = max_body
        self.mode = mode
        self.tasks: set[asyncio.Task] = set()
        self._inode = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # left by a control plane that died
        self._server = await asyncio.start_unix_server(self._connection, path=str(self.socket_path),
                                                       limit=httpio.MAX_LINE * 2)
        os.chmod(self.socket_path, self.mode)
        self._inode = os.stat(self.socket_path).st_ino

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        # Only our own socket: a worker that took the agent over made a new one.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.socket_path).st_ino == self._inode:
                self.socket_path.unlink()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if len(self.tasks) >= MAX_CONNECTIONS:
            writer.close()
            return
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:
            pass  # close() ends our own connection tasks; end quietly, not "cancelled"
        finally:
            self.tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(self, reader, writer) -> bool:
        """Serve one request; False when the connection should end."""
        api = Api.OPENAI
        try:
            request = await asyncio.wait_for(httpio.read_request(reader, self.max_body), IDLE_S)
            if request is None:
                return False
            api = _api_of(request)
            await self._dispatch(request, api, writer)
            return request.keep_alive
        except GatewayError as exc:
            await httpio.send_json(writer, exc.status, _error_body(api, exc), keep_alive=False)
            return False

    async def _dispatch(self, request: httpio.Request, api: Api, writer) -> None:
        route = (request.method, request.path)
        if route == ("GET", "/v1/models"):
            await httpio.send_json(writer, 200, self._models(api), request.keep_alive)
            return
        if route == ("POST", "/v1/chat/completions"):
            asked = openai_wire.parse(request.json())
        elif route == ("POST", "/v1/messages"):
            asked = anthropic_wire.parse(request.json())
        else:
            raise NotFound(f"no such endpoint: {request.method} {request.path[:200]}")
        reply = await self._call(asked)
        await _answer(writer, asked, reply, self.route.upstream.label, request.keep_alive)

    async def _call(self, asked: ModelRequest) -> ModelReply:
        """The upstream's reply, journaled before the harness sees it; a repeat
        of a completed call of this turn is answered from the journal."""
        route = self.route
        if route.journal is not None:
            # A paused agent's next call waits here until resume: pause works
            # at a step boundary whatever harness runs in the sandbox.
            while await _journal_op(route.journal.paused()):
                await asyncio.sleep(HOLD_POLL_S)
        started, key = time.monotonic(), request_hash(asked)
        if route.journal is not None:
            found = await _journal_op(route.journal.completed(key))
            if found is not None:
                await _journal_op(route.journal.replayed(key, found, _ms(started)))
                return reply_of(found.data)
            # A replay costs nothing, so it is answered even over budget.
            refused = await _journal_op(route.journal.over_budget())
            if refused is not None:
                await _journal_op(route.journal.exceeded(refused))
                raise BudgetExceeded(refused.message())
        try:
            reply = await self._ask(asked)
        except GatewayError as exc:
            await self._record(asked, key, started, None, exc)
            raise
        await self._record(asked, key, started, reply, None)
        return reply

    async def _ask(self, asked: ModelRequest) -> ModelReply:
        try:
            return await self.route.upstream.complete(asked)
        except GatewayError:
            raise
        except Exception as exc:  # an upstream's bug must not kill the listener
            log.exception("upstream %s failed for agent %s", self.route.upstream.label,
                          self.route.agent_id)
            raise UpstreamError(f"the upstream failed: {type(exc).__name__}") from None

    async def _record(self, asked, key, started, reply, exc) -> None:
        if self.route.journal is None:
            return
        label = self.route.upstream.label
        usage = reply.usage if reply is not None else Usage()
        call = CallRecord(label, asked.model, asked.api.value, key, _ms(started),
                          CallStatus.OK if reply is not None else CallStatus.ERROR, usage,
                          cost_usd(label, usage, self.route.prices or {}), reply,
                          exc.message if exc is not None else "",
                          exc.status if exc is not None else 0)
        await _journal_op(self.route.journal.record(call))

    def _models(self, api: Api) -> dict:
        ids = self.route.upstream.model_ids()
        if api is Api.ANTHROPIC:
            return {"data": [{"type": "model", "id": m, "display_name": m,
                              "created_at": "1970-01-01T00:00:00Z"} for m in ids],
                    "has_more": False, "first_id": ids[0] if ids else None,
                    "last_id": ids[-1] if ids else None}
        return openai_wire.models(ids)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


async def _journal_op(op):
    """A journal that cannot write (a lost lease, a full disk) fails the call:
    an answer the journal does not hold could be paid for twice."""
    try:
        return await op
    except Exception as exc:
        log.warning("the model call cannot be journaled: %s", exc)
        raise GatewayError("the control plane cannot journal the call; retry later",
                           status=503, code="journal_unavailable") from None


def _api_of(request: httpio.Request) -> Api:
    if request.path == "/v1/messages" or "anthropic-version" in request.headers:
        return Api.ANTHROPIC
    return Api.OPENAI


def _error_body(api: Api, exc: GatewayError) -> dict:
    return anthropic_wire.error(exc) if api is Api.ANTHROPIC else openai_wire.error(exc)


async def _answer(writer, asked: ModelRequest, reply: ModelReply, model: str,
                  keep_alive: bool) -> None:
    call_id = uuid.uuid4().hex[:24]
    pieces = [reply.text[i:i + CHUNK] for i in range(0, len(reply.text), CHUNK)]
    if not asked.stream:
        body = (anthropic_wire.message(reply, model, call_id) if asked.api is Api.ANTHROPIC
                else openai_wire.completion(reply, model, call_id))
        await httpio.send_json(writer, 200, body, keep_alive)
        return
    stream = httpio.EventStream(writer)
    await stream.start()
    if asked.api is Api.ANTHROPIC:
        for event, data in anthropic_wire.stream_events(reply, model, call_id, pieces):
            await stream.send(data, event)
    else:
        for data in openai_wire.stream_chunks(reply, model, call_id, pieces, asked.stream_usage):
            await stream.send(data)
    await stream.end()


__all__ = ["BadRequest", "GatewayServer", "Route", "Upstream"]
