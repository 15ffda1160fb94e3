"""Wake-ups: payload-less "re-read after your cursor" messages to an agent's group.

A wake-up carries no rows: the database is the only source of events, so a
lost or duplicated wake-up can delay a stream but never corrupt it.

Two sources of wake-ups:
- notify(), called by the journal after a commit in this process;
- the data_version watcher (embedded SQLite default only): the in-memory
  channel layer does not cross processes, so one task per serving process polls
  SQLite's `PRAGMA data_version`, which changes when *another* connection
  commits, and wakes the watched agents whose head moved.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connections

from .models import Agent

log = logging.getLogger(__name__)

WAKE_TYPE = "transcript.append"

# The event loop that serves streams in this process (daphne's). The in-memory
# channel layer is bound to it, so wake-ups from other threads are scheduled there.
_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()

# Agent id -> number of open streams watching it (the watcher reads only these).
_watched: dict[str, int] = {}
_watcher_task: asyncio.Task | None = None
# Strong references: the loop keeps only weak ones to fire-and-forget tasks.
_pending: set[asyncio.Task] = set()

_IN_CHUNK = 500  # ids per IN (…) query, well under SQLite's variable limit


def group_name(agent_id: str) -> str:
    return f"agent.{agent_id}"


def workspace_group(workspace_id) -> str:
    """The group of a workspace's tree streams (sessions/api/tree_tail.py): woken when
    an agent is added to it; the tree tails also listen to each agent's own group."""
    return f"workspace.{workspace_id}"


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _loop
    with _lock:
        _loop = loop


def serving_loop() -> asyncio.AbstractEventLoop | None:
    """The loop the streams live on, when it runs."""
    loop = _loop
    return loop if loop is not None and loop.is_running() else None


# --- notify -------------------------------------------------------------------

def notify(agent_ids) -> None:
    """Wake every stream watching these agents. Call after commit; never raises.

    Safe from daphne's loop thread, from worker threads (sync_to_async) and from
    processes with no loop at all (management commands).
    """
    ids = list(agent_ids)
    if not ids:
        return
    try:
        _dispatch(ids)
    except Exception:  # a wake-up is best effort: the safety re-read covers it
        log.warning("wake-up for %s failed", ids, exc_info=True)


def notify_workspace(workspace_id) -> None:
    """Wake the workspace's tree streams (a new agent). Call after commit; never raises."""
    try:
        run_on_layer(lambda layer: _send_groups(layer, [workspace_group(workspace_id)]))
    except Exception:  # best effort: the tree tail's heartbeat re-reads
        log.warning("wake-up for workspace %s failed", workspace_id, exc_info=True)


def _dispatch(ids: list[str]) -> None:
    run_on_layer(lambda layer: _send(layer, ids))


def run_on_layer(make_coro) -> None:
    """Run `make_coro(layer)` on the loop that owns the channel layer.

    The in-memory layer's queues belong to the serving loop, so a caller on a
    worker thread (a sync view) schedules the send there; a caller on a loop
    runs it as a task; a process with no loop and a cross-process layer (Redis)
    sends synchronously. With no loop and an in-memory layer nobody in this
    process listens, and the serving process's data_version watcher (streams)
    or pending-command scan (worker) picks the commit up instead.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    running = _running_loop()
    loop = _loop
    if loop is not None and loop.is_running() and loop is not running:
        asyncio.run_coroutine_threadsafe(make_coro(layer), loop)
    elif running is not None:
        _spawn(running, make_coro(layer))
    elif not _is_in_memory(layer):
        async_to_sync(make_coro)(layer)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _spawn(loop: asyncio.AbstractEventLoop, coro) -> None:
    task = loop.create_task(coro)
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _is_in_memory(layer) -> bool:
    return type(layer).__name__ == "InMemoryChannelLayer"


async def _send(layer, ids) -> None:
    await _send_groups(layer, [group_name(agent_id) for agent_id in ids])


async def _send_groups(layer, groups) -> None:
    for group in groups:
        try:
            await layer.group_send(group, {"type": WAKE_TYPE})
        except Exception:  # ChannelFull and friends: the stream's safety re-read covers it
            log.warning("wake-up for %s dropped", group, exc_info=True)


# --- watch registration ---------------------------------------------------------

def watch(agent_id: str) -> None:
    """A stream on this agent opened: the watcher must look at it."""
    with _lock:
        _watched[agent_id] = _watched.get(agent_id, 0) + 1


def unwatch(agent_id: str) -> None:
    with _lock:
        count = _watched.get(agent_id, 0) - 1
        if count > 0:
            _watched[agent_id] = count
        else:
            _watched.pop(agent_id, None)


def watched() -> list[str]:
    with _lock:
        return list(_watched)


# --- the data_version watcher -----------------------------------------------------

def watcher_enabled() -> bool:
    """Only the embedded default needs it: SQLite with the in-memory layer.
    On Redis, notify() already crosses processes."""
    if connections["default"].vendor != "sqlite":
        return False
    return _is_in_memory(get_channel_layer()) and _sqlite_path() is not None


def _sqlite_path() -> str | None:
    name = str(connections["default"].settings_dict["NAME"])
    if not name or name == ":memory:" or "mode=memory" in name:
        return None
    return name


def start_data_version_watcher(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task | None:
    """Start the per-process watcher on `loop` (default: the running loop).

    Idempotent. Called on the loop's thread it returns the watcher task (the
    embedded server cancels it at shutdown); from another thread it schedules
    the start and returns None. Off the embedded SQLite default: None, no watcher.
    """
    if not watcher_enabled():
        return None
    loop = loop or asyncio.get_running_loop()
    bind_loop(loop)
    if _running_loop() is loop:
        return _start_on(loop)
    loop.call_soon_threadsafe(_start_on, loop)
    return None


def ensure_started() -> None:
    """Called by every stream from the serving loop: bind it, start the watcher once."""
    loop = asyncio.get_running_loop()
    if _loop is not loop:
        bind_loop(loop)
    task = _watcher_task
    if task is None or task.done() or task.get_loop() is not loop:
        start_data_version_watcher(loop)


def _start_on(loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
    global _watcher_task
    with _lock:
        task = _watcher_task
        if task is not None and not task.done() and task.get_loop() is loop:
            return task
        path = _sqlite_path()
        if path is None:
            return None
        watcher = DataVersionWatcher(path, _poll_interval())
        _watcher_task = loop.create_task(watcher.run(), name="alineo-data-version-watcher")
        return _watcher_task


def _poll_interval() -> float:
    return max(0.01, float(settings.ALINEO_DATA_VERSION_POLL_S))


def _agent_table() -> str:
    return Agent._meta.db_table


class DataVersionWatcher:
    """Polls `PRAGMA data_version` on its own connection and wakes watched
    agents whose last_seq moved since the last look.

    The checks run inline on the loop: each costs tens of microseconds and a
    WAL reader never waits for writers, so no thread is needed.
    """

    def __init__(self, path: str, poll_s: float, table: str | None = None):
        self.path, self.poll_s = path, poll_s
        self.table = table
        self.conn: sqlite3.Connection | None = None
        self.version: int | None = None
        # Agent id -> last_seq seen. An agent not in here counts as moved at the
        # next change: it may have been registered after a commit we already saw.
        self.seen: dict[str, int] = {}

    async def run(self) -> None:
        try:
            while True:
                await self.tick()
                await asyncio.sleep(self.poll_s)
        finally:
            self.close()

    async def tick(self) -> list[str]:
        """One look; returns the agents woken (for tests)."""
        try:
            moved = self.check()
        except sqlite3.Error:
            log.warning("data_version watcher: %s unreadable, retrying", self.path, exc_info=True)
            self.close()
            return []
        if moved:
            layer = get_channel_layer()
            if layer is not None:
                await _send(layer, moved)
        return moved

    def check(self) -> list[str]:
        conn = self._connection()
        # Read the version before the heads: a commit between the two shows up
        # in the heads now and as a version change on the next tick, never lost.
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self.version:
            return []
        self.version = version
        return self._moved(conn, watched())

    def _moved(self, conn: sqlite3.Connection, ids: list[str]) -> list[str]:
        table = self.table or _agent_table()
        heads: dict[str, int] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start:start + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(f"SELECT id, last_seq FROM {table} WHERE id IN ({marks})", chunk)
            heads.update(rows.fetchall())
        moved = [agent for agent, seq in heads.items() if self.seen.get(agent) != seq]
        self.seen = heads  # also forgets agents no stream watches any more
        return moved

    def _connection(self) -> sqlite3.Connection:
        if self.conn is None:
            conn = sqlite3.connect(self.path, timeout=1.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = 1")
            self.conn, self.version = conn, None
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None
