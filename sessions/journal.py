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
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, IntegrityError, connections, transaction
from django.utils import timezone

from . import leases, rawtx
from .committer import GroupCommitter
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
    durable when it commits); otherwise they go through the group committer,
    which writes on its own thread and connection. A caller whose connection
    is watched (execute wrappers, query capture) writes on that connection
    itself, in a transaction of its own, so the watcher sees every statement.
    """
    items = [_encode(agent_id, t, d) for t, d in facts]
    if not items:
        return []
    db = connections[DEFAULT_DB_ALIAS]
    held = leases.bound_for(agent_id)  # a driver writes: fenced by its lease
    if db.in_atomic_block:
        if held is not None:
            leases.check(held)
        records = _write(agent_id, items)
        # The caller may change its dicts before its block commits: hand over copies, as written.
        kept = [EventRecord(r.agent_id, r.seq, r.type, json.loads(text), r.ts)
                for r, (_, _, text) in zip(records, items)] if COMMITTED else []
        transaction.on_commit(lambda: _committed({agent_id: kept}))
        return records
    if held is not None or db.execute_wrappers or db.force_debug_cursor:
        return _append_here(agent_id, items, held)
    return committer.submit(agent_id, items)


def _append_here(agent_id: str, items: list[tuple[str, dict, str]],
                 held: leases.Held | None = None) -> list[EventRecord]:
    """Write and commit on the caller's own connection (no group commit); with
    ``held``, only while this worker still holds the agent's lease."""
    try:
        with transaction.atomic():
            if held is not None:
                leases.check(held)
            records = _write(agent_id, items)
    except (IntegrityError, DatabaseError) as exc:
        error = _translate(exc)
        if isinstance(error, JournalUnavailable):
            note_unwritable(agent_id, exc)
        raise error from exc
    _committed({agent_id: records})
    return records


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
        with connections[DEFAULT_DB_ALIAS].cursor() as django_cur:
            return _write_groups(groups, django_cur)
    db = db or transaction.get_connection()  # the wrapper itself: each `connection.x` costs a lookup
    batch = _Batch(cur, ph, db)
    out = [batch.add(agent_id, requests) for agent_id, requests in groups]
    batch.insert()
    return out


class _Batch:
    """The rows of one transaction's appends, agent by agent."""

    def __init__(self, cur, ph: str, db):
        self.cur, self.ph, self.db = cur, ph, db
        self.now = timezone.now()
        self.db_now = db.ops.adapt_datetimefield_value(self.now)
        self.pg = db.vendor == "postgresql"
        self.rows: list[tuple] = []

    def add(self, agent_id: str, requests) -> list[list[EventRecord]]:
        """Bump the agent's head (and project its row), then stage its rows."""
        n = sum(len(items) for items in requests)
        seq, at, at_db = self._bump(agent_id, n, state_mod.row_projection(
            ((t, d) for items in requests for t, d, _ in items), AgentStatus.values))
        per_request = []
        for items in requests:
            recs = []
            for t, d, text in items:
                self.rows.append((agent_id, seq, t, text, at_db))
                recs.append(EventRecord(agent_id, seq, t, d, at))
                seq += 1
            per_request.append(recs)
        return per_request

    def _bump(self, agent_id: str, n: int, changes: dict[str, Any]):
        """UPDATE … RETURNING: the first seq of the ``n`` new rows, and their ts."""
        sets, params = self.sets(n, changes)
        # PostgreSQL: the time is read once the agent row is locked, so ts never
        # goes back along seq (a writer that waited for the lock comes later).
        # SQLite's BEGIN IMMEDIATE already serialises writers before `now`.
        clock = ", clock_timestamp()" if self.pg else ""
        self.cur.execute(
            f"UPDATE agent_sessions_agent SET {sets} WHERE id = {self.ph} RETURNING last_seq{clock}",
            params + [agent_id],
        )
        row = self.cur.fetchone()
        if row is None:
            raise UnknownAgent(f"no agent {agent_id}")
        at, at_db = (row[1], row[1]) if self.pg else (self.now, self.db_now)
        return row[0] - n + 1, at, at_db

    def sets(self, n: int, changes: dict[str, Any]) -> tuple[str, list]:
        """The agent row's SET clause: the head moves by ``n``, the projection applied."""
        ph = self.ph
        sets, params = [f"last_seq = last_seq + {ph}"], [n]
        if changes:
            unless_paused = changes.pop(state_mod.UNLESS_PAUSED, False)
            changes["updated_at"] = self.db_now
            for column, value in changes.items():
                if unless_paused and column in ("status", "status_reason"):
                    # A paused agent stays paused whatever its turn does (state.HELD_BY_PAUSE).
                    sets.append(f"{column} = CASE WHEN status = 'paused' THEN {column} ELSE {ph} END")
                else:
                    sets.append(f"{column} = {ph}")
                params.append(value)
        return ", ".join(sets), params

    def insert(self) -> None:
        ph, cast = self.ph, "::jsonb" if self.pg else ""
        self.cur.executemany(
            "INSERT INTO agent_sessions_event (agent_id, seq, type, data, ts) "
            f"VALUES ({ph}, {ph}, {ph}, {ph}{cast}, {ph})",
            self.rows,
        )


class _PgBatch(_Batch):
    """PostgreSQL: one statement per agent bumps its head and inserts its rows (a
    data-modifying CTE, ts read once the row is locked), and BEGIN with every
    statement goes in one round trip (rawtx.run_pipelined): measured, each round
    trip to the server cost more than the rows (bench/append_throughput.py)."""

    SQL = ("WITH b AS (UPDATE agent_sessions_agent SET {sets} WHERE id = %s"
           " RETURNING last_seq, clock_timestamp() AS at),"
           " i AS (INSERT INTO agent_sessions_event (agent_id, seq, type, data, ts)"
           " SELECT %s, b.last_seq - %s + u.o, u.t, u.d::jsonb, b.at"
           " FROM b, unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(t, d, o))"
           " SELECT last_seq, at FROM b")

    def __init__(self, db):
        super().__init__(None, "%s", db)
        self.statements: list[tuple[str, list]] = []
        self.staged: list[tuple[str, Any]] = []

    def add(self, agent_id: str, requests) -> None:
        items = [item for reqs in requests for item in reqs]
        sets, params = self.sets(len(items), state_mod.row_projection(
            ((t, d) for t, d, _ in items), AgentStatus.values))
        self.statements.append((self.SQL.format(sets=sets), params + [
            agent_id, agent_id, len(items), [t for t, _, _ in items], [text for _, _, text in items]]))
        self.staged.append((agent_id, requests))

    def records(self, rows: list) -> list[list[list[EventRecord]]]:
        """Each agent's records from its statement's (last_seq, ts); before COMMIT."""
        out = []
        for (agent_id, requests), row in zip(self.staged, rows):
            if row is None:
                raise UnknownAgent(f"no agent {agent_id}")
            seq = row[0] - sum(len(items) for items in requests) + 1
            per_request = []
            for items in requests:
                per_request.append([EventRecord(agent_id, seq + k, t, d, row[1])
                                    for k, (t, d, _) in enumerate(items)])
                seq += len(items)
            out.append(per_request)
        return out


def _commit_groups(groups, before_commit):
    """One transaction on this thread's connection: on the DB-API connection
    itself (sessions/rawtx.py) when nothing watches queries, else through
    Django. `before_commit()` runs once the rows are written, just before COMMIT."""
    db = connections[DEFAULT_DB_ALIAS]
    if rawtx.usable(db) and db.vendor == "postgresql":
        batch = _PgBatch(db)
        for agent_id, requests in groups:
            batch.add(agent_id, requests)
        return rawtx.run_pipelined(db, batch.statements, batch.records, before_commit)
    if rawtx.usable(db):
        return rawtx.run(db, lambda cur, ph: _write_groups(groups, cur, ph, db), before_commit)
    with transaction.atomic():
        written = _write_groups(groups)
        before_commit()
    return written


def _close_connection() -> None:
    try:
        connections[DEFAULT_DB_ALIAS].close()
    except Exception:  # closing a broken connection may fail too; the next use reconnects
        log.warning("journal committer: closing its connection failed", exc_info=True)


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, JournalError):
        return exc
    if isinstance(exc, IntegrityError):
        return JournalError(f"append refused by the database: {exc}")
    return JournalUnavailable(f"the transcript cannot be written: {exc}")


# Looked up at call time (lambdas), so tests may replace _commit_groups.
#: The process's group committer (sessions/committer.py).
committer = GroupCommitter(
    commit_groups=lambda groups, before_commit: _commit_groups(groups, before_commit),
    translate=lambda exc: _translate(exc),
    unwritable=lambda agent_id, exc: note_unwritable(agent_id, exc),
    committed=lambda written: _committed(written),
    close_connection=lambda: _close_connection(),
    refused=(JournalError, IntegrityError, DatabaseError),
)
if hasattr(os, "register_at_fork"):  # a forked child has no committer thread: start afresh
    os.register_at_fork(after_in_child=committer.reset)


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

def replay(agent_id: str, *, through: int | None = None, write_snapshot: bool = True,
           from_scratch: bool = False) -> dict:
    """The agent's state: the newest usable snapshot (none ``from_scratch``)
    plus the events after it.

    Raises Unrecoverable (and marks the agent so) when the transcript cannot be folded.
    """
    start, state = (0, state_mod.initial_state()) if from_scratch else _newest_snapshot(agent_id, through)
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


#: Called on the committing thread right after each commit, before its callers
#: resume, with {agent_id: its records}: the serving process's streams take
#: them without a read (sessions/api/tails.py). Must not raise or block.
COMMITTED: list = []


def _committed(written: dict[str, list[EventRecord]]) -> None:
    for agent_id in written:
        if _unwritable_marks.pop(agent_id, None) is not None:
            log.warning("agent %s: the transcript is writable again", agent_id)
    for listener in COMMITTED:
        try:
            listener(written)
        except Exception:  # a hand-off is best effort: the wake-up's read covers it
            log.warning("journal: a commit listener failed", exc_info=True)
    wakeups.notify(list(written))


def unrecoverable_reason(agent_id: str) -> str | None:
    return _unwritable_marks.get(agent_id)


def effective_status(agent: Agent) -> tuple[str, str]:
    """Status and reason, honest even when the database could not take an
    unrecoverable mark (pages and the API show this, never the bare row)."""
    reason = unrecoverable_reason(agent.id)
    if reason:
        return AgentStatus.UNRECOVERABLE.value, reason
    return agent.status, agent.status_reason


def purge_agent(agent_id: str) -> None:
    """Delete an agent and its whole transcript (the only way events are ever deleted)."""
    with transaction.atomic():
        Snapshot.objects.filter(agent_id=agent_id).delete()
        Agent.objects.filter(pk=agent_id).delete()
        # The append-only trigger allows this only once the agent row is gone.
        Event.objects.filter(agent_id=agent_id).delete()
