"""The relay: bridge events → the transcript, exactly once.

One :class:`Relay` per driven agent long-polls ``events`` after the durable
cursor (``Agent.bridge_cursor`` in session ``Agent.bridge_session``) on a
connection of its own. Each page is journaled with the same type and data
(plus ``bseq``) AND the cursor is advanced in ONE transaction, guarded by the
cursor it started from; only then is the page acked to the bridge. A worker
that dies anywhere in between re-reads the page from the old cursor (the
bridge keeps unacked events) and journals it once: either the transaction
committed (cursor moved, nothing is re-journaled) or it did not (nothing was).

Only what a sandbox may write is journaled (sessions/worker/admission.py: a
refused event becomes ``bridge.refused``), with bound secrets redacted, also
when split across delta chunks (sessions/credentials.py StreamRedactor).

After a page is committed the relay answers what it asked for:
``request.spawn`` (a child agent, through sessions.commands.spawn_child with an
Idempotency-Key derived from the bridge session and request id),
``request.memory`` (sessions.memory) and, after ``turn.finished``, calls
``after_turn(turn, seq)`` (the driver's turn checkpoint).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from channels.db import database_sync_to_async
from django.db import transaction

from sandboxes.bridge.protocol import BridgeEvent
from sandboxes.bridge_client import BridgeError, BridgeRequestError
from sessions import commands, credentials, journal, memory
from sessions.gateway.usage import turn_usage
from sessions.models import Agent

from . import admission, store
from .context import CursorMoved, Refused
from .link import BridgeLink

log = logging.getLogger(__name__)

POLL_WAIT_S = 20
PAGE_LIMIT = 200
#: Facts that keep the bridge's own time of the event (``bridge_ts``): the
#: dashboard times a tool call by them, as the relay may journal a call and its
#: result in one page (a catch-up after a restart) with one commit time.
TIMED_EVENTS = frozenset({"tool.dispatched", "tool.result"})
#: What the bridge asks the control plane for (answered with `reply`).
REQUESTS = ("request.spawn", "request.memory")


class Relay:
    def __init__(self, agent_id: str, link: BridgeLink, cursor: int, session: str, *,
                 secrets=(), after_turn: Callable[[int, int], Awaitable[None]] | None = None):
        self.agent_id = agent_id
        self.link = link
        self.client = link.events
        self.cursor = cursor
        self.session = session
        self.head = cursor
        self.redactor = credentials.StreamRedactor(secrets)
        self.after_turn = after_turn

    async def run(self) -> None:
        """Relay until the connection is lost (BridgeUnavailable) or cancelled."""
        while True:
            try:
                page = await self.client.events(self.cursor, wait=POLL_WAIT_S, limit=PAGE_LIMIT)
            except BridgeRequestError as exc:
                await self._cursor_error(exc)
                continue
            sid = page.session_id
            self.head = page.head
            if self.session and sid and sid != self.session:
                await self._new_session(sid, reason="session_changed")
                continue
            if not page.events:
                continue
            facts, mine = self._facts(page.events, sid)
            records = await _commit(self.agent_id, self.cursor, self.session, sid,
                                    page.events[-1].bseq, facts)
            self.cursor, self.session = page.events[-1].bseq, sid
            try:
                await self.client.ack(self.cursor)
            except BridgeRequestError as exc:  # bad_ack: harmless, the next page tells
                log.warning("agent %s: ack %d refused: %s", self.agent_id, self.cursor, exc)
            for event, record in zip(page.events, [records[i] for i in mine]):
                if record.type == event.type:  # a refused event asks for nothing
                    await self._after(event, record.seq)

    def _facts(self, events, sid: str) -> tuple[list[tuple[str, dict]], list[int]]:
        """The page's facts, and where each event's own fact is among them.
        A bseq that skips numbers (a session file edited from inside the
        sandbox: our bridge numbers 1, 2, 3 …) is a loss the contract says
        must not be silent: ``bridge.events_lost`` for the skipped range is
        journaled in the same transaction, just before the event after it."""
        facts, mine, last = [], [], self.cursor
        for event in events:
            if event.bseq > last + 1:
                log.warning("agent %s: bridge events %d..%d are missing (a bseq gap)",
                            self.agent_id, last + 1, event.bseq - 1)
                facts.append(("bridge.events_lost", {"session_id": sid or self.session,
                                                     "after": last, "through": event.bseq - 1,
                                                     "reason": "bseq_gap"}))
            mine.append(len(facts))
            facts.append(self._fact(event))
            last = event.bseq
        return facts, mine

    def _fact(self, event: BridgeEvent) -> tuple[str, dict]:
        """The transcript fact for one bridge event: refused unless a sandbox
        may write it (sessions/worker/admission.py); bound secrets redacted,
        also across delta chunks."""
        why = admission.refusal(event.type, event.data)
        if why is not None:
            log.warning("agent %s: refused bridge event %s (bseq %s): %s", self.agent_id,
                        event.type[:64], event.bseq, why)
            return admission.refused_fact(event.bseq, event.type, why)
        data = {**self.redactor.redact(event.type, event.data), "bseq": event.bseq}
        if event.type in TIMED_EVENTS:
            data["bridge_ts"] = event.ts  # checked by the protocol: an ISO time with a zone
        return event.type, data

    # --- cursor trouble (docs/BRIDGE.md "events / ack") --------------------------------
    async def _cursor_error(self, exc: BridgeRequestError) -> None:
        sid = exc.info.session_id or ""
        if exc.code == "cursor_ahead":
            if sid and sid != self.session:
                # A rebuilt bridge counts from 1 again: start over in its session.
                await self._new_session(sid, reason="session_changed")
                return
            # Same session, fewer events: its session file went back (a
            # restored checkpoint). Continue from its head; say so.
            head = exc.info.head or 0
            await _reset(self.agent_id, self.cursor, self.session, sid or self.session, head,
                         ("bridge.cursor_reset", {"session_id": sid or self.session,
                                                  "from": self.cursor, "to": head,
                                                  "reason": "cursor_ahead"}))
            self.cursor, self.session = head, sid or self.session
            return
        if exc.code == "cursor_pruned":
            # Someone acked events we never journaled: report the hole, never hide it.
            acked = exc.info.acked or 0
            await _reset(self.agent_id, self.cursor, self.session, sid or self.session, acked,
                         ("bridge.events_lost", {"session_id": sid or self.session,
                                                 "after": self.cursor, "through": acked,
                                                 "reason": "cursor_pruned"}))
            self.cursor, self.session = acked, sid or self.session
            return
        raise exc

    async def _new_session(self, sid: str, reason: str) -> None:
        await _reset(self.agent_id, self.cursor, self.session, sid, 0,
                     ("bridge.session_changed", {"from": self.session, "to": sid,
                                                 "cursor": self.cursor, "reason": reason}))
        self.cursor, self.session = 0, sid

    # --- what a committed event asks for -------------------------------------------------
    async def _after(self, event: BridgeEvent, seq: int) -> None:
        try:
            if event.type in REQUESTS:
                await self.answer(event)
            elif event.type == "turn.finished" and self.after_turn is not None:
                await self.after_turn(_turn_of(event.data), seq)
        except BridgeError:
            raise
        except Exception:
            log.exception("agent %s: handling %s (bseq %s) failed", self.agent_id, event.type,
                          event.bseq)

    async def answer(self, event: BridgeEvent) -> None:
        """Answer a request.spawn / request.memory event with `reply`."""
        data = event.data
        request_id = data.get("request_id")
        if not isinstance(request_id, str):
            return
        try:
            if event.type == "request.spawn":
                key = f"bridge:{self.agent_id}:{self.session}:{request_id}"[:255]
                child = await _spawn_child(self.agent_id, data.get("prompt"), data.get("spec"), key)
                reply = {"result": {"agent_id": child}}
            else:
                result = await _memory(self.agent_id, data.get("op"), data.get("key"), data.get("value"))
                reply = {"result": result}
        except Refused as exc:
            reply = {"error": {"code": exc.code, "message": exc.message}}
        try:
            await self.link.control.reply(request_id, **reply)
        except BridgeRequestError as exc:
            # unknown_request: the tool gave up waiting (or the bridge restarted).
            log.info("agent %s: reply to %s refused: %s", self.agent_id, request_id, exc)

    async def answer_pending(self, request_ids: list[str]) -> None:
        """At reattach: requests the bridge still waits for whose events were
        journaled by a worker that died before replying."""
        for event in await store.request_events(self.agent_id, list(request_ids)):
            await self.answer(event)


# --- database work (sync, run through database_sync_to_async) ----------------------------


def _turn_of(data: dict) -> int:
    turn = data.get("turn")
    return turn if isinstance(turn, int) and not isinstance(turn, bool) and turn > 0 else 0


@database_sync_to_async
def _commit(agent_id: str, cursor: int, session: str, new_session: str, through: int, facts):
    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, bridge_cursor=cursor, bridge_session=session).update(
            bridge_cursor=through, bridge_session=new_session)
        if moved != 1:
            raise CursorMoved(f"agent {agent_id}: the bridge cursor is no longer {session}:{cursor}")
        return journal.append_many(agent_id, [_with_usage(agent_id, f) for f in facts])


def _with_usage(agent_id: str, fact: tuple[str, dict]) -> tuple[str, dict]:
    """A turn's end carries what its model calls used (docs/GATEWAY.md), summed
    from the gateway's model.call facts, which are journaled before the
    bridge sees each answer: all of the turn's are in by now."""
    etype, data = fact
    if etype not in ("turn.finished", "turn.interrupted"):
        return fact
    return etype, {**data, "usage": turn_usage(agent_id, _turn_of(data))}


@database_sync_to_async
def _reset(agent_id: str, cursor: int, session: str, new_session: str, new_cursor: int, fact) -> None:
    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, bridge_cursor=cursor, bridge_session=session).update(
            bridge_cursor=new_cursor, bridge_session=new_session)
        if moved != 1:
            raise CursorMoved(f"agent {agent_id}: the bridge cursor is no longer {session}:{cursor}")
        if session:  # adopting the first session of a fresh sandbox is no news
            journal.append(agent_id, *fact)


@database_sync_to_async
def _spawn_child(agent_id: str, prompt, spec, key: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise Refused("bad_request", "spawn needs a non-empty prompt")
    try:
        return commands.spawn_child(agent_id, prompt, spec if isinstance(spec, dict) else None, key)
    except commands.CommandRefused as exc:
        # The tool shows the message only (sandboxes/bridge/requests.py): the
        # code goes in front, so a model can tell a quota from an escalation.
        raise Refused(exc.code, f"{exc.code}: {exc.message}") from exc


@database_sync_to_async
def _memory(agent_id: str, op, key, value):
    try:
        return memory.handle(agent_id, op, key, value)
    except memory.MemoryRequestError as exc:
        raise Refused("bad_request", str(exc)) from exc
