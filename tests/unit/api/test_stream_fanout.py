"""Streams that fan out (issue 14): one shared tail per agent per process.

In process, through the real consumer (sessions.api.stream.TranscriptStream)
and the real database; each stream is driven by a small ASGI client
(tests/unit/api/sse_asgi.py) whose `send` can be held shut, as a client that stops reading would.

- a query counter: N streams on one agent, one commit -> one journal read;
- the hand-over: a stream catching up on a long backlog while commits keep
  coming gets strictly consecutive ids, with the tail's ring and without it;
- a slow client: its queue passes the buffer, it leaves the tail, the others
  are not delayed, and it catches up on its own with no gap and no duplicate;
- the heartbeat's safety re-read, once per agent.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.db import transaction

from sessions import journal, wakeups
from sessions.api import tails
from sessions.models import Event, Workspace

from .sse_asgi import Client, count_queries

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def many_streams(workspace):
    Workspace.objects.filter(pk=workspace.pk).update(max_streams_per_user=500)


@pytest.fixture(autouse=True)
def in_process_only(monkeypatch):
    """No data_version watcher: only this process's commits (notify) wake streams."""
    monkeypatch.setattr(wakeups, "watcher_enabled", lambda: False)
    yield
    assert tails.TAILS.by_agent == {}, "a tail outlived its streams"


def facts(n: int, start: int = 1) -> list[tuple[str, dict]]:
    return [("message.user", {"text": f"fact {i}"}) for i in range(start, start + n)]


append = database_sync_to_async(journal.append_many)


async def closing(clients) -> None:
    for client in clients:
        await client.close()


@pytest.fixture
def event_reads(monkeypatch):
    """Counts SELECTs on the event table."""
    table = Event._meta.db_table
    return count_queries(monkeypatch, lambda sql: sql.lstrip().upper().startswith("SELECT") and table in sql)


# --- one read per commit --------------------------------------------------------------

async def test_one_commit_is_one_journal_read_whatever_the_number_of_streams(
        agent, owner_token, many_streams, event_reads):
    await append(agent.id, facts(1))
    clients = [Client(agent.id, owner_token).start() for _ in range(25)]
    try:
        for client in clients:
            assert await client.until(1) == [1]
        await asyncio.sleep(0.1)  # every stream has joined the tail
        event_reads["n"] = 0
        await append(agent.id, facts(1, start=2))
        for client in clients:
            assert await client.until(2) == [1, 2]
        await asyncio.sleep(0.1)
        assert event_reads["n"] == 1, f"{event_reads['n']} journal reads for one commit and 25 streams"
        assert len(tails.TAILS.by_agent) == 1
    finally:
        await closing(clients)


# --- the hand-over -------------------------------------------------------------------------

@pytest.mark.parametrize("ring", [tails.RING, 0], ids=["from-the-ring", "reading-again"])
async def test_a_stream_catching_up_while_commits_keep_coming_gets_consecutive_ids(
        agent, owner_token, many_streams, monkeypatch, ring):
    monkeypatch.setattr(tails, "RING", ring)
    for start in range(1, 1201, 300):  # a backlog of 1,200: three pages for a new stream
        await append(agent.id, facts(300, start=start))
    followers = [Client(agent.id, owner_token, after=1200).start() for _ in range(3)]
    late: list[Client] = []
    try:
        await asyncio.sleep(0.2)  # the followers keep the tail moving

        async def keep_committing() -> None:
            for i in range(1201, 1281):
                await append(agent.id, facts(1, start=i))
                if i % 10 == 0:  # a new stream from the start, now and then
                    late.append(Client(agent.id, owner_token).start())
                await asyncio.sleep(0.002)

        await keep_committing()
        for client in followers:
            assert await client.until(1280) == list(range(1201, 1281))
        for client in late:
            assert await client.until(1280) == list(range(1, 1281))
    finally:
        await closing(followers + late)


async def test_a_reconnect_inside_the_ring_takes_no_read_of_its_own(
        agent, owner_token, many_streams, event_reads, monkeypatch):
    monkeypatch.setattr(journal, "COMMITTED", [])  # rows come by the tail's read only
    await append(agent.id, facts(5))
    first = Client(agent.id, owner_token).start()
    try:
        await first.until(5)
        await append(agent.id, facts(3, start=6))
        await first.until(8)  # by the tail's read: no hand-off in this test (no later read)
        event_reads["n"] = 0
        second = Client(agent.id, owner_token, after=6).start()
        assert await second.until(8) == [7, 8]
        await second.close()
        assert event_reads["n"] == 0  # no read of its own: the rows are the tail's
    finally:
        await first.close()


# --- the slow client ---------------------------------------------------------------------

async def test_a_slow_client_falls_back_to_its_own_reads_and_never_delays_the_others(
        agent, owner_token, many_streams, settings, caplog):
    settings.ALINEO_SSE_STREAM_BUFFER_KB = 1
    await append(agent.id, facts(1))
    fast = [Client(agent.id, owner_token).start() for _ in range(2)]
    slow = Client(agent.id, owner_token).start()
    try:
        for client in fast + [slow]:
            await client.until(1)
        await asyncio.sleep(0.1)
        slow.hold()  # its sends block from here on, as with a client that stopped reading
        for i in range(2, 42):
            await append(agent.id, [("message.assistant", {"text": f"reply {i} " + "x" * 200})])
            await asyncio.sleep(0.002)
        for client in fast:  # not held up by the slow one
            assert await client.until(41) == list(range(1, 42))
        assert "slow client" in caplog.text
        assert slow.ids()[-1] < 41

        slow.let_go()
        assert await slow.until(41) == list(range(1, 42))  # no gap, no duplicate
        # Back on the tail: the next commit reaches everyone.
        await append(agent.id, facts(1, start=42))
        for client in fast + [slow]:
            assert (await client.until(42))[-1] == 42
    finally:
        await closing(fast + [slow])


# --- heartbeats ---------------------------------------------------------------------------

async def test_the_heartbeat_re_reads_once_per_agent_for_all_its_streams(
        agent, owner_token, many_streams, settings, monkeypatch, event_reads):
    settings.ALINEO_SSE_HEARTBEAT_S = 0.3
    await append(agent.id, facts(1))
    clients = [Client(agent.id, owner_token).start() for _ in range(10)]
    try:
        for client in clients:
            await client.until(1)
        monkeypatch.setattr(wakeups, "notify", lambda ids: None)  # wake-ups lost …
        monkeypatch.setattr(journal, "COMMITTED", [])  # … and no hand-off (another process's commit)
        tail = tails.TAILS.by_agent[agent.id]
        event_reads["n"], beats = 0, tail.beats
        await append(agent.id, facts(1, start=2))
        for client in clients:  # delivered by the safety re-read
            assert await client.until(2) == [1, 2]
            assert b": ka\n\n" in client.body
        await asyncio.sleep(0.1)  # the read of the last beat is done
        reads, beats = event_reads["n"], tail.beats - beats
        # + 1: the read of a beat just before the count started may land inside it.
        assert 1 <= reads <= beats + 1, f"{reads} reads in {beats} heartbeats: one each, not one per stream"
    finally:
        await closing(clients)


# --- this process's commits: handed over without a read ------------------------------------

async def test_a_commit_in_this_process_reaches_the_streams_without_a_read(
        agent, owner_token, many_streams, settings, monkeypatch, event_reads):
    settings.ALINEO_SSE_HEARTBEAT_S = 600  # no safety re-read during the test
    await append(agent.id, facts(1))
    clients = [Client(agent.id, owner_token).start() for _ in range(10)]
    try:
        for client in clients:
            await client.until(1)
        await asyncio.sleep(0.1)  # every stream has joined the tail
        monkeypatch.setattr(wakeups, "notify", lambda ids: None)  # no wake-up, so no read
        tail = tails.TAILS.by_agent[agent.id]
        event_reads["n"], handed = 0, tail.handed
        await append(agent.id, facts(2, start=2))
        for client in clients:
            assert await client.until(3) == [1, 2, 3]
        assert tail.handed == handed + 1 and event_reads["n"] == 0
    finally:
        await closing(clients)


async def test_rows_that_do_not_follow_the_tail_are_left_to_the_read(agent, owner_token, many_streams):
    await append(agent.id, facts(1))
    clients = [Client(agent.id, owner_token).start() for _ in range(3)]
    try:
        for client in clients:
            await client.until(1)
        await asyncio.sleep(0.1)
        tail = tails.TAILS.by_agent[agent.id]
        handed = tail.handed
        ahead = await append(agent.id, facts(2, start=2))  # seq 2 and 3, handed over
        for client in clients:
            assert await client.until(3) == [1, 2, 3]
        gap = journal.EventRecord(agent.id, 5, "message.user", {"text": "not committed"}, ahead[0].ts)
        tails.TAILS.take(agent.id, tails.encode_records([gap]))  # seq 4 missing: refused
        tails.TAILS.take(agent.id, tails.encode_records(ahead))  # seen already: refused
        assert tail.handed == handed + 1 and tail.cursor == 3
        await append(agent.id, facts(1, start=4))
        for client in clients:
            assert await client.until(4) == [1, 2, 3, 4]
    finally:
        await closing(clients)


async def test_facts_of_an_atomic_block_are_handed_over_as_written_once_it_commits(
        agent, owner_token, many_streams, settings, monkeypatch):
    settings.ALINEO_SSE_HEARTBEAT_S = 600
    await append(agent.id, facts(1))
    clients = [Client(agent.id, owner_token).start() for _ in range(3)]

    @database_sync_to_async
    def in_a_block(rolled_back: bool) -> None:
        data = {"text": "as written"}
        try:
            with transaction.atomic():
                journal.append(agent.id, "message.user", data)
                data["text"] = "changed after the append"
                if rolled_back:
                    raise RuntimeError("roll back")
        except RuntimeError:
            pass

    try:
        for client in clients:
            await client.until(1)
        await asyncio.sleep(0.1)
        monkeypatch.setattr(wakeups, "notify", lambda ids: None)  # only the hand-off delivers
        tail = tails.TAILS.by_agent[agent.id]
        handed = tail.handed
        await in_a_block(rolled_back=True)
        await in_a_block(rolled_back=False)
        for client in clients:
            assert await client.until(2) == [1, 2]
            assert b'"as written"' in client.body and b"changed after" not in client.body
        assert tail.handed == handed + 1
    finally:
        await closing(clients)
