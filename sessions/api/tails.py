"""One shared tail per agent per serving process.

Every open stream on an agent used to re-read the journal after its own cursor
on every wake-up: one commit cost N reads, queued on database_sync_to_async's
one thread. Now the process keeps, for each agent with open streams, one
:class:`Tail`: the only reader of what is committed after the highest cursor.
It reads once per wake-up, encodes each row once, and hands the same bytes to
every stream that has joined it.

A stream reads the database itself only for its own backlog (a new connection,
a reconnect with an old cursor, or after it fell behind); when it has caught up
it joins the tail (:meth:`Tail.join`). The hand-over has no gap and no
duplicate: it happens with no ``await`` between checking the cursors and
joining, and the rows between the stream's cursor and the tail's come from the
tail's ring of recent rows, or, when the ring does not reach back that far, the
stream reads once more on its own and tries again.

The tail subscribes to the agent's wake-up group before any stream reads its
backlog, so a commit after that read always wakes the tail. Heartbeats (a
comment line to every joined stream, then the safety re-read: layer messages
are at-most-once, the database is not) run once per agent, not per stream.

A stream that cannot keep up is not waited for: :meth:`Member.offer` never
blocks, and a stream whose unsent bytes pass ``ALINEO_SSE_STREAM_BUFFER_KB``
leaves the tail, drops what it had queued and reads on its own from what it
really sent (see sessions/api/stream.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError

from sessions import journal, sbjournal, wakeups

from .direct import chunk
from .frames import format_event, format_reset

log = logging.getLogger(__name__)

PAGE = 500  # rows per DB read
RING = 1000  # recent encoded rows a tail keeps for the hand-over …
RING_BYTES = 1 << 20  # … and at most this many bytes of them
KEEPALIVE = b": ka\n\n"


@dataclass(frozen=True)
class Rows:
    """Consecutive encoded rows: ``pieces`` as (seq, frame), ``blob`` all of them joined."""

    pieces: list[tuple[int, bytes]]
    blob: bytes

    @property
    def first(self) -> int:
        return self.pieces[0][0]

    @property
    def last(self) -> int:
        return self.pieces[-1][0]

    @functools.cached_property
    def chunk(self) -> bytes:
        """``blob`` framed as one HTTP/1.1 chunk, once for every stream (sessions/api/direct.py)."""
        return chunk(self.blob)

    def after(self, cursor: int) -> "Rows | None":
        """Only the rows with seq > cursor (None: none)."""
        if self.first > cursor:
            return self
        rest = [p for p in self.pieces if p[0] > cursor]
        return Rows(rest, b"".join(f for _, f in rest)) if rest else None


def encode(page: journal.Page) -> Rows:
    return encode_records(page.events)


def encode_records(records) -> Rows:
    pieces = [(rec.seq, format_event(rec.as_dict())) for rec in records]
    return Rows(pieces, b"".join(f for _, f in pieces))


class Member(Protocol):
    """What a tail needs of a stream. None of these may await."""

    cursor: int

    def offer(self, rows: Rows) -> None: ...

    def offer_reset(self, head: int) -> None: ...

    def offer_keepalive(self) -> None: ...


@database_sync_to_async
def read_page(agent_id: str, after: int) -> journal.Page:
    return journal.page_after(agent_id, after, PAGE)


class Tail:
    """The shared reader of one agent's new rows in this process."""

    def __init__(self, agent_id: str, reader=read_page):
        self.agent_id = agent_id  # an agent's id, or a sandbox session's (SB_TAILS)
        self.reader = reader
        self.cursor: int | None = None  # every row <= cursor was handed to the members
        self.members: set = set()
        self.holders = 0  # open streams on this agent, joined or still catching up
        self.recent: deque[tuple[int, bytes]] = deque()
        self.recent_bytes = 0
        self.lock = asyncio.Lock()
        self.dirty = False
        self.closed = False
        self.reads = 0  # journal reads by this tail (for tests) …
        self.beats = 0  # … and heartbeats …
        self.handed = 0  # … and commits taken without a read (take)
        self.channel: str | None = None
        self.ready = asyncio.get_running_loop().create_future()
        self.tasks: list[asyncio.Task] = []
        self.flusher: asyncio.Task | None = None
        self.starter: asyncio.Task | None = None

    # --- life -----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            layer = get_channel_layer()
            # The default prefix: channels_redis reads every process-local channel
            # through one key per prefix, and only the default one is read for sure.
            self.channel = await layer.new_channel()
            await self.subscribe(layer)
            wakeups.ensure_started()
            self.tasks = [asyncio.create_task(self._listen(layer)),
                          asyncio.create_task(self._heartbeat())]
            self.ready.set_result(None)
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise

    async def subscribe(self, layer) -> None:
        """Join the wake-up groups (and the watcher's list) of what we read."""
        await layer.group_add(wakeups.group_name(self.agent_id), self.channel)
        wakeups.watch(self.agent_id)

    async def stop(self) -> None:
        self.closed = True
        for task in self.tasks + ([self.flusher] if self.flusher else []):
            if task is not asyncio.current_task():
                task.cancel()
        if self.channel is None:
            return
        layer = get_channel_layer()
        try:
            for group in self.unwatch():
                await layer.group_discard(group, self.channel)
        except Exception:  # pragma: no cover - the layer expires it anyway
            log.warning("tail %s: group_discard failed", self.agent_id, exc_info=True)

    def unwatch(self) -> list[str]:
        """Stop the watcher looking on our behalf; the groups to leave."""
        wakeups.unwatch(self.agent_id)
        return [wakeups.group_name(self.agent_id)]

    # --- joining ----------------------------------------------------------------------

    def can_take(self, cursor: int) -> bool:
        """A stream at `cursor` may join without reading: the ring reaches back to it."""
        return (not self.closed and self.cursor is not None and cursor <= self.cursor
                and (cursor == self.cursor or self._since(cursor) is not None))

    def join(self, member: Member) -> bool:
        """Join if `member` (which has sent every row through its cursor) can
        continue from the tail: True, and it gets everything after its cursor
        from now on. False: the tail is ahead past its ring; read on your own
        and try again. Never awaits, so nothing is committed between the check
        and the join that one of the two would miss."""
        if self.closed:
            return False
        if self.cursor is None:  # the first: the tail goes on from where its read ended
            self.cursor = member.cursor
        elif member.cursor < self.cursor:
            missed = self._since(member.cursor)
            if missed is None:
                return False
            member.offer(missed)
        self.members.add(member)
        if self.dirty:  # a wake-up came while nobody could read
            self.wake()
        return True

    def leave(self, member: Member) -> None:
        self.members.discard(member)

    def _since(self, cursor: int) -> Rows | None:
        if not self.recent or self.recent[0][0] > cursor + 1:
            return None
        pieces = [p for p in self.recent if p[0] > cursor]
        return Rows(pieces, b"".join(f for _, f in pieces))

    # --- reading ------------------------------------------------------------------------

    def take(self, rows: Rows) -> None:
        """Rows this process has just committed (on the loop, no await): handed
        to the members without a read when they follow the cursor at once.
        Otherwise (a read in flight, a gap, rows already seen) nothing: the
        commit's wake-up reads them, as for another process's commit."""
        if self.closed or self.cursor is None or self.lock.locked():
            return
        if rows.first != self.cursor + 1:
            return
        self.handed += 1
        self._remember(rows)
        self.cursor = rows.last
        for member in list(self.members):
            member.offer(rows)

    def wake(self) -> None:
        self.dirty = True
        if self.flusher is None and not self.closed:
            self.flusher = asyncio.create_task(self.flush())

    async def flush(self) -> None:
        """Read after the cursor until nothing is new; one reader at a time."""
        try:
            async with self.lock:
                while self.dirty and not self.closed and self.cursor is not None:
                    self.dirty = False
                    await self._drain()
        except DatabaseError:
            # A locked or missing DB must not end the streams: the next wake-up
            # or heartbeat reads again.
            log.warning("tail %s: transcript read failed", self.agent_id, exc_info=True)
        finally:
            if self.flusher is asyncio.current_task():
                self.flusher = None

    async def _drain(self) -> None:
        while not self.closed:
            self.reads += 1
            page = await self.reader(self.agent_id, self.cursor)
            if self.cursor > page.head:
                self._reset(page.head)
                continue
            if page.events:
                rows = encode(page)
                self._remember(rows)
                self.cursor = rows.last
                for member in list(self.members):
                    member.offer(rows)
            if not page.has_more:
                return

    def _remember(self, rows: Rows) -> None:
        self.recent.extend(rows.pieces)
        self.recent_bytes += len(rows.blob)
        while self.recent and (len(self.recent) > RING or self.recent_bytes > RING_BYTES):
            self.recent_bytes -= len(self.recent.popleft()[1])

    def _reset(self, head: int) -> None:
        self.cursor = head
        self.recent.clear()
        self.recent_bytes = 0
        for member in list(self.members):
            member.offer_reset(head)

    # --- tasks --------------------------------------------------------------------------

    async def _listen(self, layer) -> None:
        while not self.closed:
            try:
                await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # pragma: no cover - keep listening; the heartbeat re-reads
                log.warning("tail %s: receive failed", self.agent_id, exc_info=True)
                await asyncio.sleep(1.0)
                continue
            self.wake()

    async def _heartbeat(self) -> None:
        base = float(settings.ALINEO_SSE_HEARTBEAT_S)
        while not self.closed:
            await asyncio.sleep(base * random.uniform(0.8, 1.2))
            self.beats += 1
            for member in list(self.members):
                member.offer_keepalive()
            self.wake()


class Tails:
    """The tails of this process, by agent id (or sandbox session id: each
    journal its own Tails and reader). Used from the serving loop only."""

    def __init__(self, reader=read_page, tail_class: type[Tail] = Tail):
        self.by_agent: dict[str, Tail] = {}
        self.reader = reader
        self.tail_class = tail_class  # a workspace's tree has its own (sessions/api/tree_tail.py)

    async def acquire(self, agent_id: str) -> Tail:
        """The agent's tail, subscribed to its wake-ups; release it when done."""
        tail = self.by_agent.get(agent_id)
        if tail is None or tail.closed:
            tail = self.by_agent[agent_id] = self.tail_class(agent_id, self.reader)
            tail.starter = asyncio.create_task(self._start(tail))  # held: the loop keeps weak refs
        tail.holders += 1
        try:
            await asyncio.shield(tail.ready)
        except BaseException:
            await self.release(tail)
            raise
        return tail

    def take(self, agent_id: str, rows: Rows) -> None:
        tail = self.by_agent.get(agent_id)
        if tail is not None:
            tail.take(rows)

    async def _start(self, tail: Tail) -> None:
        try:
            await tail.start()
        except Exception:
            tail.closed = True  # the next stream on this agent makes a new one
            log.warning("tail %s: cannot subscribe", tail.agent_id, exc_info=True)

    async def release(self, tail: Tail) -> None:
        tail.holders -= 1
        if tail.holders > 0:
            return
        if self.by_agent.get(tail.agent_id) is tail:
            del self.by_agent[tail.agent_id]
        await tail.stop()


TAILS = Tails()


def _hand_off(written: dict) -> None:
    """journal.COMMITTED, on the committing thread: this process's commits for
    agents with open streams go to the serving loop as encoded rows (encoded
    here once, before the caller can touch its dicts again)."""
    loop = wakeups.serving_loop()
    if loop is None:
        return
    for agent_id, records in written.items():
        if records and agent_id in TAILS.by_agent:
            loop.call_soon_threadsafe(TAILS.take, agent_id, encode_records(records))


journal.COMMITTED.append(_hand_off)


@database_sync_to_async
def read_session_page(session_id: str, after: int):
    return sbjournal.page_after(session_id, after, PAGE)


#: Sandbox sessions' journals (sessions/sbjournal.py), woken the same way.
SB_TAILS = Tails(read_session_page)
