"""A small in-process ASGI client for the SSE consumers: one stream, whose
`send` can be held shut as a client that stops reading would."""

from __future__ import annotations

import asyncio
import json
import re

from django.db.backends import utils as db_utils

WAIT = 10.0
_ID = re.compile(rb"^id: (\d+)$", re.M)
_FRAME = re.compile(rb"id: (\d+)\nevent: ([^\n]*)\ndata: ([^\n]*)\n\n")


class Client:
    """One SSE stream on `consumer` (default: an agent's transcript stream)."""

    def __init__(self, target: str, token: str | None, after: int | None = None, *,
                 consumer=None, path: str | None = None, headers=()):
        if consumer is None:
            from sessions.api.stream import TranscriptStream as consumer
        query = b"" if after is None else f"after={after}".encode()
        auth = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.consumer = consumer
        self.scope = {
            "type": "http", "method": "GET", "path": path or f"/api/agents/{target}/stream",
            "query_string": query, "headers": auth + list(headers),
            "url_route": {"args": (), "kwargs": {"agent_id": target} if target else {}},
        }
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.open_gate = asyncio.Event()
        self.open_gate.set()
        self.body = bytearray()
        self.status: int | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> "Client":
        self.task = asyncio.create_task(self.consumer.as_asgi()(self.scope, self.inbox.get, self.send))
        self.inbox.put_nowait({"type": "http.request", "body": b""})
        return self

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        await self.open_gate.wait()
        self.body += message.get("body", b"")

    def hold(self) -> None:
        self.open_gate.clear()

    def let_go(self) -> None:
        self.open_gate.set()

    def ids(self) -> list[int]:
        return [int(m) for m in _ID.findall(bytes(self.body))]

    def frames(self) -> list[tuple[int, str, dict]]:
        """(id, event, data) of every event received."""
        return [(int(i), e.decode(), json.loads(d)) for i, e, d in _FRAME.findall(bytes(self.body))]

    async def until(self, seq: int, timeout: float = WAIT) -> list[int]:
        await self.until_true(lambda: self.ids() and self.ids()[-1] >= seq,
                              f"waiting for {seq}", timeout)
        return self.ids()

    async def until_true(self, check, what: str, timeout: float = WAIT) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not check():
            assert loop.time() < deadline, f"stream stopped at {self.ids()[-3:]}, {what}"
            await asyncio.sleep(0.005)

    async def finished(self, timeout: float = WAIT) -> None:
        await asyncio.wait_for(self.task, timeout)

    async def close(self) -> None:
        self.let_go()
        await self.inbox.put({"type": "http.disconnect"})
        await asyncio.wait_for(self.task, 5)


def count_queries(monkeypatch, counts=lambda sql: True) -> dict:
    """Counts the queries for which `counts(sql)` holds, from any thread (the
    one that serves database_sync_to_async included): {"n": …}."""
    counted = {"n": 0}
    real = db_utils.CursorWrapper._execute

    def execute(self, sql, params, *ignored):
        if counts(str(sql)):
            counted["n"] += 1
        return real(self, sql, params, *ignored)

    monkeypatch.setattr(db_utils.CursorWrapper, "_execute", execute)
    return counted
