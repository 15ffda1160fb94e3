"""Wake-ups: notify() from every kind of caller, watch registration, and the
data_version watcher against a real SQLite file written by another connection."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
from channels.layers import get_channel_layer

from sessions import wakeups


@pytest.fixture(autouse=True)
def clean_wakeups():
    yield
    wakeups.bind_loop(None)
    with wakeups._lock:
        wakeups._watched.clear()


async def subscribe(agent_id: str) -> str:
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(wakeups.group_name(agent_id), channel)
    return channel


async def received(channel: str, timeout: float = 5.0) -> dict:
    return await asyncio.wait_for(get_channel_layer().receive(channel), timeout)


async def nothing_for(channel: str, wait: float = 0.2) -> bool:
    try:
        await asyncio.wait_for(get_channel_layer().receive(channel), wait)
    except asyncio.TimeoutError:
        return True
    return False


# --- registration ---------------------------------------------------------------------

def test_watch_counts_streams_per_agent():
    wakeups.watch("ag_a")
    wakeups.watch("ag_a")
    wakeups.watch("ag_b")
    wakeups.unwatch("ag_a")
    assert sorted(wakeups.watched()) == ["ag_a", "ag_b"]  # one stream on ag_a is still open
    wakeups.unwatch("ag_a")
    wakeups.unwatch("ag_b")
    wakeups.unwatch("ag_b")  # one too many must not go negative or raise
    assert wakeups.watched() == []
    wakeups.watch("ag_b")
    assert wakeups.watched() == ["ag_b"]


# --- notify ---------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_notify_on_the_loop_wakes_the_group():
    channel = await subscribe("ag_loop")
    wakeups.notify(["ag_loop"])
    assert await received(channel) == {"type": wakeups.WAKE_TYPE}


@pytest.mark.asyncio
async def test_notify_from_a_worker_thread_reaches_the_bound_loop():
    wakeups.bind_loop(asyncio.get_running_loop())
    channel = await subscribe("ag_thread")
    other = await subscribe("ag_other")
    await asyncio.to_thread(wakeups.notify, ["ag_thread"])
    assert await received(channel) == {"type": wakeups.WAKE_TYPE}
    assert await nothing_for(other)


@pytest.mark.asyncio
async def test_notify_from_a_thread_with_its_own_loop_goes_to_the_serving_loop():
    wakeups.bind_loop(asyncio.get_running_loop())
    channel = await subscribe("ag_foreign")

    async def elsewhere():  # e.g. async_to_sync in a worker thread
        wakeups.notify(["ag_foreign"])

    await asyncio.to_thread(asyncio.run, elsewhere())
    assert await received(channel) == {"type": wakeups.WAKE_TYPE}


def test_notify_without_any_loop_is_a_no_op():
    # A management command on the in-memory layer: nobody listens here.
    errors = []
    thread = threading.Thread(target=lambda: _catch(errors, wakeups.notify, ["ag_none"]))
    thread.start()
    thread.join(5)
    assert errors == []


def test_notify_never_raises(monkeypatch):
    def broken():
        raise RuntimeError("layer misconfigured")

    monkeypatch.setattr(wakeups, "get_channel_layer", broken)
    wakeups.notify(["ag_x"])  # must not raise: the commit already happened


def _catch(errors, fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # pragma: no cover - the failure being tested for
        errors.append(exc)


# --- the data_version watcher ------------------------------------------------------------

@pytest.fixture
def db(tmp_path):
    path = tmp_path / "watch.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE agents (id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)")
    conn.executemany("INSERT INTO agents VALUES (?, 0)", [("ag_1",), ("ag_2",), ("ag_3",)])
    yield path, conn
    conn.close()


@pytest.mark.asyncio
async def test_watcher_wakes_only_watched_agents_whose_head_moved(db):
    path, writer = db
    watcher = wakeups.DataVersionWatcher(str(path), 0.01, table="agents")
    try:
        wakeups.watch("ag_1")
        wakeups.watch("ag_2")
        first = await watcher.tick()
        assert sorted(first) == ["ag_1", "ag_2"]  # never seen: woken once, to be safe
        assert await watcher.tick() == []  # nothing committed since

        c1, c2 = await subscribe("ag_1"), await subscribe("ag_2")
        writer.execute("UPDATE agents SET last_seq = 4 WHERE id = 'ag_1'")  # another connection
        writer.execute("UPDATE agents SET last_seq = 9 WHERE id = 'ag_3'")  # nobody watches ag_3
        assert await watcher.tick() == ["ag_1"]
        assert await received(c1) == {"type": wakeups.WAKE_TYPE}
        assert await nothing_for(c2)
    finally:
        watcher.close()


@pytest.mark.asyncio
async def test_watcher_sees_an_agent_registered_after_its_commit(db):
    path, writer = db
    watcher = wakeups.DataVersionWatcher(str(path), 0.01, table="agents")
    try:
        wakeups.watch("ag_1")
        await watcher.tick()
        wakeups.watch("ag_2")  # a stream opens, then a commit lands before the next look
        writer.execute("UPDATE agents SET last_seq = 1 WHERE id = 'ag_2'")
        assert await watcher.tick() == ["ag_2"]
        wakeups.unwatch("ag_2")
        writer.execute("UPDATE agents SET last_seq = 2 WHERE id = 'ag_2'")
        assert await watcher.tick() == []  # no stream watches it any more
    finally:
        watcher.close()


@pytest.mark.asyncio
async def test_watcher_task_delivers_a_commit_by_another_connection(db):
    path, writer = db
    watcher = wakeups.DataVersionWatcher(str(path), 0.01, table="agents")
    wakeups.watch("ag_3")
    channel = await subscribe("ag_3")
    task = asyncio.create_task(watcher.run())
    try:
        await received(channel)  # the first look wakes it once
        writer.execute("UPDATE agents SET last_seq = 1 WHERE id = 'ag_3'")
        assert await received(channel) == {"type": wakeups.WAKE_TYPE}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert watcher.conn is None  # the watcher closed its connection


@pytest.mark.asyncio
async def test_watcher_survives_an_unreadable_database(tmp_path):
    watcher = wakeups.DataVersionWatcher(str(tmp_path / "missing" / "x.sqlite3"), 0.01, table="agents")
    wakeups.watch("ag_1")
    assert await watcher.tick() == []  # logged and retried next tick, never raised
    assert watcher.conn is None


# --- notify reaches an open stream (in process, no server) -------------------------------

def _scope(agent_id: str, token: str, query: bytes = b"") -> dict:
    return {
        "type": "http", "method": "GET", "path": f"/api/agents/{agent_id}/stream",
        "query_string": query, "headers": [(b"authorization", f"Bearer {token}".encode())],
        "url_route": {"args": (), "kwargs": {"agent_id": agent_id}},
    }


async def _body_until(communicator, needle: bytes, timeout: float = 5.0) -> bytes:
    body = b""
    while needle not in body:
        message = await communicator.receive_output(timeout)
        assert message["type"] == "http.response.body" and message.get("more_body")
        body += message["body"]
    return body


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_append_in_this_process_wakes_an_open_stream_and_disconnect_cleans_up(
    agent, owner_token, monkeypatch
):
    from asgiref.testing import ApplicationCommunicator
    from channels.db import database_sync_to_async

    from sessions import journal
    from sessions.api.stream import TranscriptStream

    # No watcher: only the journal's notify() can deliver the live fact.
    monkeypatch.setattr(wakeups, "watcher_enabled", lambda: False)
    await database_sync_to_async(journal.append)(agent.id, "message.user", {"text": "backlog"})
    communicator = ApplicationCommunicator(TranscriptStream.as_asgi(), _scope(agent.id, owner_token))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(5)
    assert start["status"] == 200
    assert b"id: 1\n" in await _body_until(communicator, b"id: 1\n")
    assert wakeups.watched() == [agent.id]

    # journal.append from a worker thread, as a sync view or the worker does.
    await database_sync_to_async(journal.append)(agent.id, "message.assistant", {"text": "live"})
    body = await _body_until(communicator, b"\n\n", timeout=5)
    assert body.startswith(b"id: 2\nevent: message.assistant\n")

    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(5)  # the consumer ends promptly instead of hanging
    assert wakeups.watched() == []
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # the in-memory layer
        assert wakeups.group_name(agent.id) not in layer.groups
    else:  # channels_redis (REDIS_URL): the group is a sorted set of channel names
        group = wakeups.group_name(agent.id)
        assert await layer.connection(layer.consistent_hash(group)).zcard(layer._group_key(group)) == 0
