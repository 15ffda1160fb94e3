"""The live tree (issue 14, point 2): GET /api/workspaces/{name}/stream, in
process through the real consumer (sessions.api.tree_stream.TreeStream) and
the real database.

- who may follow it (401 / 403 / 404);
- a status change and a new child (and a new root) appear as `node` events;
- a reconnect resumes from its cursor: the nodes changed since, nothing when
  nothing changed, the whole tree when the cursor is out of reach;
- a query counter: one commit costs the same queries for 1 viewer as for 20.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.db import DatabaseError

from sessions import journal, wakeups
from sessions.api import tree_tail
from sessions.api.tree_stream import TreeStream
from sessions.models import Agent, ApiToken, Workspace

from .sse_asgi import Client, count_queries

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def in_process_only(monkeypatch):
    """No data_version watcher: only this process's commits (notify) wake streams."""
    monkeypatch.setattr(wakeups, "watcher_enabled", lambda: False)
    yield
    assert tree_tail.TREE_TAILS.by_agent == {}, "a tree tail outlived its streams"


@pytest.fixture
def many_streams(workspace):
    Workspace.objects.filter(pk=workspace.pk).update(max_streams_per_user=500)


def tree(token, name="acme", after=None, path=None) -> Client:
    return Client(name, token, after, consumer=TreeStream,
                  path=path or f"/api/workspaces/{name}/stream").start()


append = database_sync_to_async(journal.append)


@database_sync_to_async
def issue(user) -> str:
    return ApiToken.issue(user)[1]


@database_sync_to_async
def new_agent(workspace, owner, parent=None) -> Agent:
    agent = Agent.objects.create(workspace=workspace, created_by=owner, parent=parent,
                                 spec={"model": "demo"})
    journal.append(agent.id, "agent.spawned", {"spec": agent.spec, "parent": parent and parent.id})
    if parent is not None:
        journal.append(parent.id, "agent.child_spawned", {"child": agent.id})
    return agent


@database_sync_to_async
def tree_seq(workspace) -> int:
    return sum(Agent.objects.filter(workspace=workspace).values_list("last_seq", flat=True))


def nodes(client: Client, after: int = -1) -> list[dict]:
    return [d for i, e, d in client.frames() if e == "node" and i > after]


async def until_node(client: Client, agent_id: str, check=lambda d: True) -> dict:
    found = {}

    def seen():
        for data in nodes(client):
            if data["agent"] == agent_id and check(data):
                found.update(data)
        return bool(found)

    await client.until_true(seen, f"waiting for a node of {agent_id}")
    return found


async def settled(client: Client) -> None:
    """The stream has opened and its tail has done its first wake-up's read."""
    await client.until_true(lambda: client.body.startswith(b"retry:"), "waiting for it to open")
    await asyncio.sleep(0.1)


# --- who may follow it -----------------------------------------------------------------

async def test_anonymous_is_401_another_workspace_404_no_workspace_403(
        workspace, other_workspace, outsider, agent, django_user_model):
    outsider_token = await issue(outsider)
    loner = await database_sync_to_async(django_user_model.objects.create_user)("lou")
    loner_token = await issue(loner)
    cases = [
        (tree(None), 401, "auth.required"),
        (tree(outsider_token), 404, "not_found"),
        (tree(outsider_token, name="nope"), 404, "not_found"),
        (tree(outsider_token, name="globex" + "x" * 100), 404, "not_found"),
        (tree(loner_token, name="", path="/api/agents/stream"), 403, "workspace.none"),
    ]
    for client, status, code in cases:
        await client.finished()
        assert client.status == status, (status, bytes(client.body))
        assert code in bytes(client.body).decode()


async def test_a_member_follows_the_tree_of_their_workspace_also_as_the_default(
        agent, owner_token, teammate):
    await append(agent.id, "agent.spawned", {})
    mate = tree(await issue(teammate))
    default = tree(owner_token, name="", path="/api/agents/stream")
    try:
        for client in (mate, default):
            await settled(client)
            assert client.status == 200
        await append(agent.id, "turn.started", {})
        for client in (mate, default):
            assert (await until_node(client, agent.id))["status"] == "running"
    finally:
        await mate.close()
        await default.close()


# --- what appears -------------------------------------------------------------------------

async def test_a_status_change_appears(agent, owner_token):
    await append(agent.id, "agent.spawned", {})
    viewer = tree(owner_token, after=await tree_seq(agent.workspace))
    try:
        await settled(viewer)
        assert nodes(viewer) == []  # at the head: nothing to send
        await append(agent.id, "turn.started", {})
        node = await until_node(viewer, agent.id, lambda d: d["status"] == "running")
        assert f'id="actions-{agent.id}"' in node["html"] and "Running" in node["html"]
        assert viewer.ids()[-1] == await tree_seq(agent.workspace)
    finally:
        await viewer.close()


async def test_a_new_child_and_a_new_root_appear(agent, owner, owner_token, api):
    await append(agent.id, "agent.spawned", {})
    viewer = tree(owner_token, after=await tree_seq(agent.workspace))
    try:
        await settled(viewer)
        child = await new_agent(agent.workspace, owner, parent=agent)
        node = await until_node(viewer, child.id)
        assert node["parent"] == agent.id and child.id in node["html"]
        # A root through the API: no parent's fact wakes the tail, the workspace's group does.
        response = await database_sync_to_async(api.post)("/api/agents", {"spec": {"model": "demo"}})
        assert response.status_code == 201, response.content
        root = await until_node(viewer, response.json()["id"])
        assert root["parent"] is None
    finally:
        await viewer.close()


# --- reconnects ---------------------------------------------------------------------------

async def test_a_reconnect_resumes_from_its_cursor(workspace, owner, agent, owner_token, monkeypatch):
    await append(agent.id, "agent.spawned", {})
    other = await new_agent(workspace, owner)
    keeper = tree(owner_token)  # keeps the tail (and its ring of changes) alive
    first = tree(owner_token, after=await tree_seq(workspace))
    try:
        await settled(first)
        await append(agent.id, "turn.started", {})
        await until_node(first, agent.id)
        cursor = first.ids()[-1]
        await first.close()  # the viewer goes away; two changes while it is gone
        await append(other.id, "turn.started", {})
        await append(agent.id, "turn.finished", {})
        head = await tree_seq(workspace)
        await until_node(keeper, agent.id, lambda d: d["status"] != "running")

        again = tree(owner_token, after=cursor)  # as with Last-Event-ID: <cursor>
        await until_node(again, other.id)
        await again.until(head)
        got = {d["agent"]: d["status"] for d in nodes(again)}
        assert got.keys() == {agent.id, other.id} and all(i >= cursor for i in again.ids())
        assert "event: tree" not in bytes(again.body).decode()  # only what changed
        await again.close()

        at_head = tree(owner_token, after=head)
        await settled(at_head)
        assert at_head.frames() == []  # nothing changed since: nothing is sent again
        await at_head.close()

        # Out of the tail's reach (older than its ring, or ahead of the database): the whole tree.
        monkeypatch.setattr(tree_tail, "RING", 0)
        await append(other.id, "turn.finished", {})
        await until_node(keeper, other.id, lambda d: d["status"] != "running")
        for stale in (cursor, 10**9):
            client = tree(owner_token, after=stale)
            await client.until_true(lambda: any(e == "tree" for _, e, _ in client.frames()),
                                    "waiting for the whole tree")
            (seq, _, data), = [f for f in client.frames() if f[1] == "tree"]
            assert seq == await tree_seq(workspace)
            assert [n["agent"] for n in data["nodes"]] == [agent.id, other.id]
            await client.close()
    finally:
        await keeper.close()


async def test_a_database_that_cannot_be_read_is_a_503_not_a_500(agent, owner_token, monkeypatch):
    async def unreadable(*args):
        raise DatabaseError("database is locked")

    monkeypatch.setattr(tree_tail.TREE_TAILS, "reader", unreadable)
    client = tree(owner_token)
    await client.finished()
    assert client.status == 503 and b"service.unavailable" in client.body


async def test_a_bad_cursor_is_a_400(agent, owner_token):
    client = tree(owner_token, after="x1")
    await client.finished()
    assert client.status == 400 and b"cursor.invalid" in client.body


# --- one read per commit --------------------------------------------------------------------

@pytest.fixture
def queries(monkeypatch):
    # A connection opened meanwhile reads its durability settings back
    # (sessions/durability.py): connection set-up, not a read for the commit.
    return count_queries(monkeypatch, lambda sql: not sql.lstrip().upper().startswith(("PRAGMA", "SHOW")))


async def test_one_commit_costs_the_same_queries_for_one_viewer_as_for_twenty(
        agent, owner_token, many_streams, queries):
    await append(agent.id, "agent.spawned", {})

    async def cost_of_one_commit(viewers: list[Client], text: str) -> int:
        for client in viewers:
            await settled(client)
        queries["n"] = 0
        await append(agent.id, "message.user", {"text": text})
        head = await tree_seq(agent.workspace)  # one query of ours, in both counts
        for client in viewers:
            await client.until(head)
        await asyncio.sleep(0.1)  # nothing more is read after the deliveries
        return queries["n"]

    viewers = [tree(owner_token)]
    try:
        alone = await cost_of_one_commit(viewers, "one")
        viewers += [tree(owner_token) for _ in range(19)]
        crowd = await cost_of_one_commit(viewers, "two")
        assert crowd == alone, f"{alone} queries for 1 viewer, {crowd} for 20"
        tail = tree_tail.TREE_TAILS.by_agent[agent.workspace_id]
        assert len(tail.members) == 20
    finally:
        for client in viewers:
            await client.close()
