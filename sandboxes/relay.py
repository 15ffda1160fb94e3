"""The relay: bridge events → the transcript, exactly once.

One :class:`Relay` per driven agent long-polls ``events`` after the durable
cursor (``Agent.bridge_cursor`` in session ``Agent.bridge_session``) on a
connection of its own. Each page is journaled with the same type and data
(plus ``bseq``) AND the cursor is advanced in ONE transaction, guarded by the
cursor it started from; only then is the page acked to the bridge. A worker
that dies anywhere in between re-reads the page from the old cursor (the
bridge keeps unacked events) and journals it once: either the transaction
committed (cursor moved, nothing is re-journaled) or it did not (nothing was).

After a page is committed the relay answers what it asked for:
``request.spawn`` (a child agent, through sessions.commands.spawn_child with an
Idempotency-Key derived from the bridge session and request id),
``request.memory`` (sessions.memory) and, after ``turn.finished``, a turn
checkpoint when the spec asks for one (sandboxes.driver.take_checkpoint).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.db import transaction

from sandboxes.bridge_client import BridgeClient, BridgeError, BridgeRequestError

if TYPE_CHECKING:  # pragma: no cover
    from sandboxes.driver import AgentDriver

log = logging.getLogger(__name__)

POLL_WAIT_S = 20
PAGE_LIMIT = 200


class CursorMoved(Exception):
    """The durable cursor is not where this relay left it: another driver
    journaled these events. This relay must stop."""


class Relay:
    def __init__(self, driver: AgentDriver, client: BridgeClient, cursor: int, session: str):
        self.driver = driver
        self.agent_id = driver.agent_id
        self.client = client
        self.cursor = cursor
        self.session = session
        self.head = cursor

    async def run(self) -> None:
        """Relay until the connection is lost (BridgeUnavailable) or cancelled."""
        while True:
            try:
                page = await self.client.request(
                    "events", after=self.cursor, wait=POLL_WAIT_S, limit=PAGE_LIMIT,
                    timeout=POLL_WAIT_S + 15,
                )
            except BridgeRequestError as exc:
                await self._cursor_error(exc)
                continue
            sid = str(page.get("session_id") or "")
            self.head = int(page.get("head") or 0)
            if self.session and sid and sid != self.session:
                await self._new_session(sid, reason="session_changed")
                continue
            events = page.get("events") or []
            if not events:
                continue
            secrets = self.driver.info.secrets if self.driver.info else None
            records = await _commit(self.agent_id, self.cursor, self.session, sid, events, secrets)
            self.cursor, self.session = int(events[-1]["bseq"]), sid
            try:
                await self.client.request("ack", through=self.cursor)
            except BridgeRequestError as exc:  # bad_ack: harmless, the next page tells
                log.warning("agent %s: ack %d refused: %s", self.agent_id, self.cursor, exc)
            for event, record in zip(events, records):
                await self._after(event, record.seq)

    # --- cursor trouble (docs/BRIDGE.md "events / ack") --------------------------------
    async def _cursor_error(self, exc: BridgeRequestError) -> None:
        sid = str(exc.extra.get("session_id") or "")
        if exc.code == "cursor_ahead":
            if sid and sid != self.session:
                # A rebuilt bridge counts from 1 again: start over in its session.
                await self._new_session(sid, reason="session_changed")
                return
            # Same session, fewer events: its session file went back (a
            # restored checkpoint). Continue from its head; say so.
            head = int(exc.extra.get("head") or 0)
            await _reset(self.agent_id, self.cursor, self.session, sid or self.session, head,
                         ("bridge.cursor_reset", {"session_id": sid or self.session,
                                                  "from": self.cursor, "to": head,
                                                  "reason": "cursor_ahead"}))
            self.cursor, self.session = head, sid or self.session
            return
        if exc.code == "cursor_pruned":
            # Someone acked events we never journaled: report the hole, never hide it.
            acked = int(exc.extra.get("acked") or 0)
            await _reset(self.agent_id, self.cursor, self.session, sid or self.session, acked,
                         ("bridge.events_lost", {"session_id": sid or self.session,
                                                 "after": self.cursor, "through": acked}))
            self.cursor, self.session = acked, sid or self.session
            return
        raise exc

    async def _new_session(self, sid: str, reason: str) -> None:
        await _reset(self.agent_id, self.cursor, self.session, sid, 0,
                     ("bridge.session_changed", {"from": self.session, "to": sid,
                                                 "cursor": self.cursor, "reason": reason}))
        self.cursor, self.session = 0, sid

    # --- what a committed event asks for -------------------------------------------------
    async def _after(self, event: dict, seq: int) -> None:
        etype, data = event.get("type"), event.get("data") or {}
        try:
            if etype in ("request.spawn", "request.memory"):
                await self.answer(event)
            elif etype == "turn.finished":
                await self.driver.take_checkpoint(int(data.get("turn") or 0), seq)
        except BridgeError:
            raise
        except Exception:
            log.exception("agent %s: handling %s (bseq %s) failed", self.agent_id, etype,
                          event.get("bseq"))

    async def answer(self, event: dict) -> None:
        """Answer a request.spawn / request.memory event with `reply`."""
        data = event.get("data") or {}
        request_id = data.get("request_id")
        if not isinstance(request_id, str):
            return
        try:
            if event["type"] == "request.spawn":
                key = f"bridge:{self.agent_id}:{self.session}:{request_id}"[:255]
                child = await _spawn_child(self.agent_id, data.get("prompt"), data.get("spec"), key)
                reply = {"result": {"agent_id": child}}
            else:
                result = await _memory(self.agent_id, data.get("op"), data.get("key"), data.get("value"))
                reply = {"result": result}
        except _Refused as exc:
            reply = {"error": {"code": exc.code, "message": exc.message}}
        try:
            await self.driver.control.request("reply", request_id=request_id, **reply)
        except BridgeRequestError as exc:
            # unknown_request: the tool gave up waiting (or the bridge restarted).
            log.info("agent %s: reply to %s refused: %s", self.agent_id, request_id, exc)

    async def answer_pending(self, request_ids: list[str]) -> None:
        """At reattach: requests the bridge still waits for whose events were
        journaled by a worker that died before replying."""
        for event in await _request_events(self.agent_id, list(request_ids)):
            await self.answer(event)


class _Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


# --- database work (sync, run through database_sync_to_async) ----------------------------


def _facts(events: list[dict], secrets=None) -> list[tuple[str, dict]]:
    """Bridge events as transcript facts. A bound secret the agent printed
    (`echo $TOKEN`) is redacted here, before it can reach the transcript."""
    from sessions.credentials import redact

    out = []
    for ev in events:
        data = redact(ev.get("data"), secrets)
        data = dict(data) if isinstance(data, dict) else {"value": data}
        data["bseq"] = ev["bseq"]
        out.append((str(ev.get("type") or "bridge.unknown")[:64], data))
    return out


@database_sync_to_async
def _commit(agent_id: str, cursor: int, session: str, new_session: str, events: list[dict],
            secrets=None):
    from sessions import journal
    from sessions.models import Agent

    expected = cursor + 1
    if int(events[0]["bseq"]) != expected:
        log.warning("agent %s: bridge events start at bseq %s, expected %d",
                    agent_id, events[0]["bseq"], expected)
    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, bridge_cursor=cursor, bridge_session=session).update(
            bridge_cursor=int(events[-1]["bseq"]), bridge_session=new_session)
        if moved != 1:
            raise CursorMoved(f"agent {agent_id}: the bridge cursor is no longer {session}:{cursor}")
        return journal.append_many(agent_id, _facts(events, secrets))


@database_sync_to_async
def _reset(agent_id: str, cursor: int, session: str, new_session: str, new_cursor: int, fact) -> None:
    from sessions import journal
    from sessions.models import Agent

    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, bridge_cursor=cursor, bridge_session=session).update(
            bridge_cursor=new_cursor, bridge_session=new_session)
        if moved != 1:
            raise CursorMoved(f"agent {agent_id}: the bridge cursor is no longer {session}:{cursor}")
        if session:  # adopting the first session of a fresh sandbox is no news
            journal.append(agent_id, *fact)


@database_sync_to_async
def _spawn_child(agent_id: str, prompt, spec, key: str) -> str:
    from sessions import commands

    if not isinstance(prompt, str) or not prompt.strip():
        raise _Refused("bad_request", "spawn needs a non-empty prompt")
    try:
        return commands.spawn_child(agent_id, prompt, spec if isinstance(spec, dict) else None, key)
    except commands.CommandRefused as exc:
        raise _Refused(exc.code, exc.message) from exc


@database_sync_to_async
def _memory(agent_id: str, op, key, value):
    from sessions import memory

    try:
        return memory.handle(agent_id, op, key, value)
    except memory.MemoryError_ as exc:
        raise _Refused("bad_request", str(exc)) from exc


@database_sync_to_async
def _request_events(agent_id: str, request_ids: list[str]) -> list[dict]:
    from sessions.models import Event

    if not request_ids:
        return []
    rows = (Event.objects.filter(agent_id=agent_id, type__in=("request.spawn", "request.memory"))
            .order_by("-seq")[:200])
    wanted, out = set(request_ids), []
    for row in reversed(list(rows)):
        if row.data.get("request_id") in wanted:
            wanted.discard(row.data["request_id"])
            out.append({"type": row.type, "data": row.data, "bseq": row.data.get("bseq")})
    return out
