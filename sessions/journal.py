"""The journal: the only writer of transcript events.

Appends get seq = head + 1, head + 2 … under the agent row's lock (an UPDATE …
RETURNING in the same transaction), so seq has no gaps and commit order equals
seq order on SQLite and PostgreSQL alike. Appends that arrive together from
several threads are group-committed: one caller leads and writes everyone's
facts in one transaction, so synchronous=FULL costs one fsync per batch.

A fact is acknowledged (append returns) only after its transaction committed.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from . import state as state_mod
from . import wakeups
from .models import Agent, AgentStatus, Event, Snapshot, iso_ts

log = logging.getLogger(__name__)


class JournalError(Exception):
    """Root of the journal's exceptions. `permanent` tells a caller whether retrying can help."""

    permanent = True


class UnknownAgent(JournalError):
    pass


class InvalidFact(JournalError):
    pass


class JournalUnavailable(JournalError):
    """The database refused the write (read-only, full disk, locked too long)."""

    permanent = False


class Unrecoverable(JournalError):
    """The agent's transcript cannot be replayed; the agent is marked unrecoverable."""


@dataclass(frozen=True)
class EventRecord:
    agent_id: str
    seq: int
    type: str
    data: dict
    ts: datetime

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "ts": iso_ts(self.ts), "data": self.data}


@dataclass(frozen=True)
class Page:
    events: list[EventRecord]
    has_more: bool
    head: int

    @property
    def first_seq(self) -> int | None:
        return self.events[0].seq if self.events else None

    @property
    def last_seq(self) -> int | None:
        return self.events[-1].seq if self.events else None


# --- append -------------------------------------------------------------------

Fact = tuple[str, dict]


def append(agent_id: str, type: str, data: dict | None = None) -> EventRecord:
    """Append one fact; return it once durable."""
    return append_many(agent_id, [(type, data or {})])[0]


def append_many(agent_id: str, facts: Iterable[Fact]) -> list[EventRecord]:
    """Append facts for one agent, contiguous and in order, in one transaction.

    Inside a caller's atomic block the facts join that transaction (and are
    durable when it commits); otherwise they go through the group committer.
    """
    items = [_encode(agent_id, t, d) for t, d in facts]
    if not items:
        return []
    if connection.in_atomic_block:
        records = _write(agent_id, items)
        transaction.on_commit(lambda: _committed([agent_id]))
        return records
    return _committer.submit(agent_id, items)


def _encode(agent_id: str, etype: str, data: dict | None) -> tuple[str, dict, str]:
    if not isinstance(etype, str) or not etype or len(etype) > 64:
        raise InvalidFact(f"event type must be a non-empty string of at most 64 characters: {etype!r}")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise InvalidFact("event data must be a JSON object")
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidFact(f"event data is not JSON: {exc}") from exc
    return etype, data, text


def _write(agent_id: str, items: list[tuple[str, dict, str]]) -> list[EventRecord]:
    """Write one agent's facts inside the current transaction."""
    return _write_groups([(agent_id, [items])])[0][0]


def _write_groups(
    groups: list[tuple[str, list[list[tuple[str, dict, str]]]]], cur=None, ph: str = "%s", db=None
) -> list[list[list[EventRecord]]]:
    """Write several requests, grouped by agent, inside the current transaction.

    `groups` is [(agent_id, [items of request 1, items of request 2 …])]; each
    agent's requests get contiguous seqs in the order given. Per agent: one
    UPDATE … RETURNING that bumps the head and applies the status/sandbox
    projection (the agent row lock that orders commits); then one INSERT
    executemany for every row of the batch. Returns the records per agent,
    per request.
    """
    if cur is None:
        with connection.cursor() as django_cur:
            return _write_groups(groups, django_cur)
    db = db or transaction.get_connection()  # the wrapper itself: each `connection.x` costs a lookup
    now = timezone.now()
    db_now = db.ops.adapt_datetimefield_value(now)
    cast = "::jsonb" if db.vendor == "postgresql" else ""
    rows: list[tuple] = []
    out: list[list[list[EventRecord]]] = []
    for agent_id, requests in groups:
        n = sum(len(items) for items in requests)
        sets, params = [f"last_seq = last_seq + {ph}"], [n]
        changes = _projection((t, d) for items in requests for t, d, _ in items)
        if changes:
            changes["updated_at"] = db_now
            for column, value in changes.items():
                sets.append(f"{column} = {ph}")
                params.append(value)
        cur.execute(
            f"UPDATE agent_sessions_agent SET {', '.join(sets)} WHERE id = {ph} RETURNING last_seq",
            params + [agent_id],
        )
        row = cur.fetchone()
        if row is None:
            raise UnknownAgent(f"no agent {agent_id}")
        seq = row[0] - n + 1
        per_request = []
        for items in requests:
            recs = []
            for t, d, text in items:
                rows.append((agent_id, seq, t, text, db_now))
                recs.append(EventRecord(agent_id, seq, t, d, now))
                seq += 1
            per_request.append(recs)
        out.append(per_request)
    cur.executemany(
        "INSERT INTO agent_sessions_event (agent_id, seq, type, data, ts) "
        f"VALUES ({ph}, {ph}, {ph}, {ph}{cast}, {ph})",
        rows,
    )
    return out


def _projection(facts) -> dict[str, Any]:
    """The agent row's status and sandbox id as the facts (type, data) leave them."""
    changes: dict[str, Any] = {}
    for etype, data in facts:
        if etype == "agent.status" and data.get("status") in AgentStatus.values:
            changes["status"] = data["status"]
            changes["status_reason"] = str(data.get("reason", ""))
        elif etype in state_mod._STATUS_BY_TYPE:
            changes["status"] = state_mod._STATUS_BY_TYPE[etype]
            changes["status_reason"] = str(data.get("reason", ""))
        if etype == "agent.sandbox" or (etype == "agent.restored" and data.get("new_sandbox_id")):
            changes["sandbox_id"] = str(data.get("sandbox_id") or data.get("new_sandbox_id"))
    return changes


@dataclass
class _Request:
    agent_id: str
    items: list
    done: bool = False
    result: list[EventRecord] | None = None
    error: BaseException | None = None


@dataclass
class _GroupCommitter:
    """Leader/follower group commit: whoever finds no leader writes the queue."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    queue: list[_Request] = field(default_factory=list)
    leading: bool = False

    def submit(self, agent_id: str, items: list) -> list[EventRecord]:
        req = _Request(agent_id, items)
        with self.cond:
            self.queue.append(req)
            while not req.done and self.leading:
                self.cond.wait()
            if req.done:
                return self._outcome(req)
            self.leading = True
            batch, self.queue = self.queue, []
        try:
            self._commit(batch)
        finally:
            with self.cond:
                self.leading = False
                self.cond.notify_all()
        return self._outcome(req)

    @staticmethod
    def _outcome(req: _Request) -> list[EventRecord]:
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    def _commit(self, batch: list[_Request]) -> None:
        by_agent: dict[str, list[_Request]] = {}
        for req in batch:  # queue order is kept within each agent
            by_agent.setdefault(req.agent_id, []).append(req)
        groups = [(agent_id, [r.items for r in reqs]) for agent_id, reqs in by_agent.items()]
        try:
            db = transaction.get_connection()
            if db.vendor == "sqlite" and not db.execute_wrappers and not db.queries_logged:
                written = _sqlite_transaction(groups)
            else:
                with transaction.atomic():
                    written = _write_groups(groups)
            for reqs, results in zip(by_agent.values(), written):
                for req, result in zip(reqs, results):
                    req.result = result
        except (JournalError, IntegrityError, DatabaseError) as exc:
            if len(batch) == 1:
                batch[0].error = _translate(exc)
                if isinstance(batch[0].error, JournalUnavailable):
                    note_unwritable(batch[0].agent_id, exc)
            else:  # one bad request must not fail the others: retry them one by one
                for req in batch:
                    req.result, req.error = None, None
                    self._commit([req])
                return
        else:
            _committed(sorted({req.agent_id for req in batch}))
        for req in batch:
            req.done = True


def _sqlite_transaction(groups):
    """The committer's transaction on SQLite, on the DB-API connection itself.

    Measured (bench/append_throughput.py): atomic() and Django's cursor wrapper
    cost ~0.15 ms of Python per transaction, as much as the write itself, and
    the leader holds the lock everyone waits on meanwhile. The leader runs
    outside any atomic block (append_many checked), so it can issue BEGIN
    IMMEDIATE … COMMIT itself. Errors still come out as Django's. Not used when
    something watches queries (execute wrappers, query capture): those get
    the Django path so they see every statement.
    """
    db = transaction.get_connection()
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        cur = raw.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                written = _write_groups(groups, cur, "?", db)
                cur.execute("COMMIT")
            except BaseException:
                if raw.in_transaction:
                    cur.execute("ROLLBACK")
                raise
        finally:
            cur.close()
    return written


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, JournalError):
        return exc
    if isinstance(exc, IntegrityError):
        return JournalError(f"append refused by the database: {exc}")
    return JournalUnavailable(f"the transcript cannot be written: {exc}")


_committer = _GroupCommitter()


# --- read -----------------------------------------------------------------------

def _records(agent_id: str, rows) -> list[EventRecord]:
    return [EventRecord(agent_id, seq, etype, data, ts) for seq, etype, data, ts in rows]


def head(agent_id: str) -> int:
    value = Agent.objects.filter(pk=agent_id).values_list("last_seq", flat=True).first()
    return 0 if value is None else value


def page_after(agent_id: str, after: int, limit: int) -> Page:
    """Events with seq > after, oldest first (a keyset query on (agent, seq))."""
    rows = list(
        Event.objects.filter(agent_id=agent_id, seq__gt=after)
        .order_by("seq")
        .values_list("seq", "type", "data", "ts")[: limit + 1]
    )
    return Page(_records(agent_id, rows[:limit]), len(rows) > limit, head(agent_id))


def page_before(agent_id: str, before: int, limit: int) -> Page:
    """The `limit` events just below `before`, oldest first."""
    rows = list(
        Event.objects.filter(agent_id=agent_id, seq__lt=before)
        .order_by("-seq")
        .values_list("seq", "type", "data", "ts")[: limit + 1]
    )
    rows = rows[:limit]
    rows.reverse()
    has_more = bool(rows) and rows[0][0] > 1
    return Page(_records(agent_id, rows), has_more, head(agent_id))


# --- replay -----------------------------------------------------------------------

def replay(agent_id: str, *, through: int | None = None, write_snapshot: bool = True) -> dict:
    """The agent's state: the newest usable snapshot plus the events after it.

    Raises Unrecoverable (and marks the agent so) when the transcript cannot be folded.
    """
    start, state = _newest_snapshot(agent_id, through)
    rows = Event.objects.filter(agent_id=agent_id, seq__gt=start).order_by("seq")
    if through is not None:
        rows = rows.filter(seq__lte=through)
    folded = 0
    try:
        for seq, etype, data, ts in rows.values_list("seq", "type", "data", "ts").iterator(chunk_size=2000):
            state = state_mod.reduce(state, {"seq": seq, "type": etype, "data": data, "ts": iso_ts(ts)})
            folded += 1
    except (state_mod.ReplayError, ValueError, TypeError) as exc:
        reason = f"replay failed: {exc}"
        mark_unrecoverable(agent_id, reason)
        raise Unrecoverable(reason) from exc
    if write_snapshot and through is None and folded >= settings.ALINEO_SNAPSHOT_EVERY:
        write_snapshot_of(agent_id, state)
    return state


def _newest_snapshot(agent_id: str, through: int | None) -> tuple[int, dict]:
    snaps = Snapshot.objects.filter(agent_id=agent_id).order_by("-through_seq")
    if through is not None:
        snaps = snaps.filter(through_seq__lte=through)
    for snap in snaps[:3]:
        try:
            return snap.through_seq, state_mod.upgrade(snap.state, snap.version)
        except state_mod.ReplayError as exc:
            # A snapshot from a newer release is a cache we cannot read: fold from further back.
            log.warning("agent %s: skipping snapshot at %s: %s", agent_id, snap.through_seq, exc)
    return 0, state_mod.initial_state()


def write_snapshot_of(agent_id: str, state: dict, keep: int = 2) -> None:
    try:
        with transaction.atomic():
            Snapshot.objects.get_or_create(
                agent_id=agent_id,
                through_seq=state["last_seq"],
                defaults={"version": state_mod.SNAPSHOT_VERSION, "state": state},
            )
            stale = Snapshot.objects.filter(agent_id=agent_id).order_by("-through_seq")[keep:]
            Snapshot.objects.filter(pk__in=[s.pk for s in stale]).delete()
    except DatabaseError as exc:  # a snapshot is a cache: failing to write one is not fatal
        log.warning("agent %s: snapshot not written: %s", agent_id, exc)


# --- unrecoverable ------------------------------------------------------------

# Agents marked while the database could not even take the mark. The API reads
# this too, so such an agent never looks fine while it quietly is not.
_unwritable_marks: dict[str, str] = {}


def mark_unrecoverable(agent_id: str, reason: str) -> None:
    try:
        with transaction.atomic():
            Agent.objects.filter(pk=agent_id).update(
                status=AgentStatus.UNRECOVERABLE, status_reason=reason[:2000], updated_at=timezone.now()
            )
        _unwritable_marks.pop(agent_id, None)
    except DatabaseError:
        _unwritable_marks[agent_id] = reason
    log.error("agent %s is unrecoverable: %s", agent_id, reason)


def note_unwritable(agent_id: str, exc: BaseException) -> None:
    """The agent's transcript could not be appended to. Unless it was only a lock
    timeout, the agent is unrecoverable until a later append succeeds: it must
    never look fine while its facts cannot be kept."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return
    # Only in memory: the database has just refused a write.
    _unwritable_marks[agent_id] = f"the transcript cannot be written: {text}"
    log.error("agent %s is unrecoverable: %s", agent_id, _unwritable_marks[agent_id])


def _committed(agent_ids: list[str]) -> None:
    for agent_id in agent_ids:
        if _unwritable_marks.pop(agent_id, None) is not None:
            log.warning("agent %s: the transcript is writable again", agent_id)
    wakeups.notify(agent_ids)


def unrecoverable_reason(agent_id: str) -> str | None:
    return _unwritable_marks.get(agent_id)


def purge_agent(agent_id: str) -> None:
    """Delete an agent and its whole transcript (the only way events are ever deleted)."""
    with transaction.atomic():
        Snapshot.objects.filter(agent_id=agent_id).delete()
        Agent.objects.filter(pk=agent_id).delete()
        # The append-only trigger allows this only once the agent row is gone.
        Event.objects.filter(agent_id=agent_id).delete()
