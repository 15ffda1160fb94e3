"""Quotas (the issue "The sandbox is a boundary"), tried as an attacker would.

The findings were: no cap on agents, tree depth or concurrent sandboxes per
workspace; spec limits of 1 TiB / 1024 CPUs accepted; one prompt of nested
`spawn:` lines made 24 sandboxes; no per-user cap on open streams. Now each
is a Workspace quota (docs/SECURITY.md#children-approvals-and-quotas):

    quota.agents   429  live agents          at spawn (sessions/commands/quotas.py)
    quota.depth    409  tree depth           at spawn
    quota.limits   400  spec limits          at spawn
    (a wait)            concurrent sandboxes in the worker (sessions/worker/slots.py)
    quota.streams  429  open streams a user  at the stream (sessions/api/stream.py)

In process through the JSON API and the stream consumer; live on a real
server (local backend) for the model's spawns and the sandbox wait.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from sandboxes.backends.base import SandboxStatus
from sessions import commands
from sessions.models import Agent, ApiToken, Command, Event, Workspace
from sessions.specs import LIMIT_MAX
from tests.integration.worlds import (
    WAIT, World, cleanup_sandboxes, events_of, start_server, wait_looked_at)
from tests.live import SSEStream
from tests.unit.api.conftest import Caller, assert_error


@pytest.fixture
def owner_api(owner):
    return Caller(ApiToken.issue(owner)[1])


def quotas(workspace, **values) -> None:
    Workspace.objects.filter(pk=workspace.pk).update(**values)


def written() -> tuple[int, int, int]:
    return Agent.objects.count(), Command.objects.count(), Event.objects.count()


def spawn(api, **body):
    return api.post("/api/agents", {"spec": {"model": "demo"}, **body})


# --- quota.agents --------------------------------------------------------------------------


@pytest.mark.django_db
def test_live_agents_beyond_the_quota_are_a_429_and_nothing_is_written(owner_api, workspace):
    quotas(workspace, max_agents=2)
    first = spawn(owner_api).json()["id"]
    assert spawn(owner_api).status_code == 201
    before = written()
    body = assert_error(spawn(owner_api, prompt="say: one too many"), 429, "quota.agents")
    assert (body["quota"], body["limit"], body["in_use"]) == ("max_agents", 2, 2)
    assert "acme" in body["message"] and "max_agents" in body["message"]
    assert "Workspaces → acme → Quotas" in body["message"]  # where to raise it
    assert written() == before
    # A child counts too, and an ended agent frees its place.
    assert_error(spawn(owner_api, parent=first), 429, "quota.agents")
    assert owner_api.post(f"/api/agents/{first}/stop").status_code == 202
    assert spawn(owner_api).status_code == 201


@pytest.mark.django_db
def test_a_fork_counts_as_an_agent(owner_api, workspace):
    quotas(workspace, max_agents=1)
    agent = spawn(owner_api).json()["id"]
    before = written()
    assert_error(owner_api.post(f"/api/agents/{agent}/fork", {"at_event": 1}), 429, "quota.agents")
    assert written() == before


@pytest.mark.django_db
def test_the_quota_is_per_workspace(owner_api, workspace, outsider):
    quotas(workspace, max_agents=1)
    assert spawn(owner_api).status_code == 201
    assert spawn(Caller(ApiToken.issue(outsider)[1])).status_code == 201  # globex: its own quota


# --- quota.depth ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_tree_deeper_than_the_quota_is_a_409(owner_api, workspace):
    quotas(workspace, max_depth=2)
    root = spawn(owner_api).json()["id"]
    child = spawn(owner_api, parent=root).json()["id"]
    before = written()
    body = assert_error(spawn(owner_api, parent=child), 409, "quota.depth")
    assert (body["quota"], body["limit"]) == ("max_depth", 2)
    assert "depth 3" in body["message"] and "max_depth" in body["message"]
    assert written() == before
    assert_error(owner_api.post(f"/api/agents/{root}/fork", {"at_event": 1, "parent": child}),
                 409, "quota.depth")


@pytest.mark.django_db
def test_a_models_spawn_beyond_the_depth_is_refused_for_the_tool(owner_api, workspace):
    quotas(workspace, max_depth=1)
    root = spawn(owner_api).json()["id"]
    with pytest.raises(commands.CommandRefused) as refused:
        commands.spawn_child(root, "say: hi", None, f"bridge:{root}:s:1")
    assert refused.value.code == "quota.depth"


# --- quota.limits --------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("limits, field", [
    ({"memory_mb": LIMIT_MAX["memory_mb"]}, "limits.memory_mb"),  # the 1 TiB of the finding
    ({"cpus": LIMIT_MAX["cpus"]}, "limits.cpus"),                # and its 1024 CPUs
    ({"pids": 4097}, "limits.pids"),
])
def test_spec_limits_above_the_workspaces_caps_are_a_400(owner_api, workspace, limits, field):
    quotas(workspace, max_pids=4096)
    before = written()
    body = assert_error(owner_api.post("/api/agents", {"spec": {"model": "demo", "limits": limits}}),
                        400, "quota.limits")
    assert body["field"] == field and field in body["message"]
    assert body["quota"] in ("max_memory_mb", "max_cpus", "max_pids")
    assert written() == before


@pytest.mark.django_db
def test_limits_at_the_caps_pass_and_defaults_are_lowered_to_them(owner_api, workspace):
    r = owner_api.post("/api/agents", {"spec": {"model": "demo", "limits": {
        "memory_mb": 4096, "pids": 1024, "cpus": 2.0}}})
    assert r.status_code == 201, r.content
    quotas(workspace, max_memory_mb=1024, max_cpus=0.5)  # below the spec defaults (2048, 1.0)
    r = spawn(owner_api)
    assert r.status_code == 201, r.content
    spec = Agent.objects.get(pk=r.json()["id"]).spec
    assert spec["limits"] == {"memory_mb": 1024, "pids": 512, "cpus": 0.5}
    spawned = Event.objects.get(agent_id=r.json()["id"], seq=1).data["spec"]
    assert spawned["limits"] == spec["limits"]  # the transcript says what it got


# --- quota.streams -------------------------------------------------------------------------


def _scope(agent_id: str, token: str) -> dict:
    return {"type": "http", "method": "GET", "path": f"/api/agents/{agent_id}/stream",
            "query_string": b"", "headers": [(b"authorization", f"Bearer {token}".encode())],
            "url_route": {"args": (), "kwargs": {"agent_id": agent_id}}}


async def _open(agent_id: str, token: str):
    from asgiref.testing import ApplicationCommunicator

    from sessions.api.stream import TranscriptStream

    communicator = ApplicationCommunicator(TranscriptStream.as_asgi(), _scope(agent_id, token))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(5)
    return communicator, start


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_open_streams_beyond_the_users_quota_are_a_429_with_a_json_body(
        workspace, owner, teammate, agent):
    from channels.db import database_sync_to_async

    await database_sync_to_async(quotas)(workspace, max_streams_per_user=2)
    token = (await database_sync_to_async(ApiToken.issue)(owner))[1]
    other = (await database_sync_to_async(ApiToken.issue)(teammate))[1]
    held = []
    try:
        for _ in range(2):
            communicator, start = await _open(agent.id, token)
            held.append(communicator)
            assert start["status"] == 200
        refused, start = await _open(agent.id, token)
        assert start["status"] == 429
        headers = dict(start["headers"])
        assert headers[b"Content-Type"] == b"application/json" and b"Retry-After" in headers
        body = json.loads((await refused.receive_output(5))["body"])
        assert body["code"] == "quota.streams" and body["limit"] == 2
        assert "max_streams_per_user" in body["message"] and "acme" in body["message"]
        await refused.wait(5)
        # Another member has a quota of their own.
        theirs, start = await _open(agent.id, other)
        held.append(theirs)
        assert start["status"] == 200
        # Closing one gives its place back.
        await held[0].send_input({"type": "http.disconnect"})
        await held[0].wait(5)
        again, start = await _open(agent.id, token)
        held[0] = again
        assert start["status"] == 200
    finally:
        for communicator in held:
            await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(5)
    from sessions.api.stream import OPEN

    assert OPEN.counts == {}  # every stream gave its place back


# --- live: a model's spawns, the sandbox wait, streams over HTTP -------------------------------


@pytest.fixture(scope="module")
def server():
    # An idle agent gives its slot up after 2 s of quiet (10 by default): the
    # slot test waits for that twice.
    live = start_server("local", env={"ALINEO_MAKE_ROOM_S": "2"})
    live.start()
    try:
        yield live
    finally:
        live.stop()
        cleanup_sandboxes(live, "local")
        live.__exit__(None, None, None)


_actors = iter(range(1000))


def world_with(server, **quota_values) -> World:
    """A workspace of its own (so counts are this test's) with these quotas."""
    actor = server.create_actor(f"quota{next(_actors)}")
    server.set_quotas(actor, **quota_values)
    return World(server, actor, "local")


def _spawn_errors(events) -> list[str]:
    return [e["data"]["output"] for e in events_of(events, "tool.result")
            if e["data"]["name"] == "spawn" and e["data"]["is_error"]]


def _agents(world: World) -> list[dict]:
    return world.get("/api/agents?limit=200")["agents"]


@pytest.mark.live
def test_one_prompt_of_nested_spawns_stops_at_the_quotas(server):
    world = world_with(server, max_agents=4, max_depth=3)
    nested = "spawn: spawn: spawn: spawn: spawn: say: deep"
    parent = world.spawn({"model": "demo"}, "\n".join([nested] * 6))
    events = world.wait_turns(parent, 1)
    errors = _spawn_errors(events)
    assert errors and all(e.startswith("spawn failed: quota.agents:") for e in errors), errors

    def settled(evs) -> bool:  # every agent's first turn over (its own spawns answered)
        return all(any(e["type"] == "turn.finished" for e in world.events(a["id"]))
                   for a in _agents(world))

    world.wait_for(parent, settled, "every agent's first turn")
    agents = _agents(world)
    assert len(agents) == 4, [a["id"] for a in agents]
    depth = {a["id"]: 1 for a in agents if a["parent"] is None}
    while len(depth) < len(agents):
        depth.update({a["id"]: depth[a["parent"]] + 1 for a in agents
                      if a["parent"] in depth and a["id"] not in depth})
    assert max(depth.values()) <= 3
    for a in agents:
        for error in _spawn_errors(world.events(a["id"])):
            assert error.split(":")[1].strip() in ("quota.agents", "quota.depth"), error
    r = world.post("/api/agents", {"spec": {"model": "demo"}})
    assert r.status_code == 429 and r.json()["code"] == "quota.agents"


@pytest.mark.live
def test_a_spawn_deeper_than_the_quota_is_a_tool_error(server):
    world = world_with(server, max_depth=2)
    parent = world.spawn({"model": "demo"}, "spawn: spawn: say: too deep")
    world.wait_for(parent, lambda evs: events_of(evs, "agent.child_spawned"), "the child")
    [child] = world.get(f"/api/agents/{parent}")["children"]
    events = world.wait_turns(child, 1)
    [error] = _spawn_errors(events)
    assert error.startswith("spawn failed: quota.depth:") and "depth 3" in error
    assert world.get(f"/api/agents/{child}")["children"] == []


def _running(world: World) -> int:
    from sandboxes.backends.local import LocalBackend

    mine = {a["sandbox_id"] for a in _agents(world) if a["sandbox_id"]}
    handles = LocalBackend(root=world.server.data_dir / "sandboxes").list()
    return sum(1 for h in handles if h.id in mine and h.status is SandboxStatus.RUNNING)


def _wait(world: World, check, what: str):
    """Poll `check` (a truthy result ends it), asserting meanwhile that the
    workspace never runs more than its one sandbox."""
    deadline = time.monotonic() + WAIT
    while True:
        assert _running(world) <= 1, "two sandboxes ran at once under max_sandboxes = 1"
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.live
def test_an_agent_beyond_the_sandboxes_waits_for_a_slot_and_says_so(server):
    world = world_with(server, max_sandboxes=1)
    a = world.spawn({"model": "demo"}, "say: a first")
    world.wait_turns(a, 1)
    b = world.spawn({"model": "demo"}, "say: b waits")

    def b_waits():
        detail = world.get(f"/api/agents/{b}")
        return detail if detail["status_reason"].startswith("waiting for a sandbox slot") else None

    detail = _wait(world, b_waits, "b to wait for a slot")
    assert detail["status"] == "starting" and detail["sandbox_id"] is None
    assert "1 of 1 in use" in detail["status_reason"]
    assert "max_sandboxes" in detail["status_reason"]
    wait_looked_at(world, b)  # the worker took b up again (twice): it keeps waiting, says so once
    waits = [e for e in events_of(world.events(b), "agent.status")
             if e["data"]["reason"].startswith("waiting for a sandbox slot")]
    assert len(waits) == 1

    # a is idle: it gives its slot up (unloaded after ALINEO_MAKE_ROOM_S of quiet), and b runs.
    _wait(world, lambda: events_of(world.events(b), "turn.finished"), "b's turn")
    assert events_of(world.events(a), "agent.unloaded")
    reasons = [e["data"]["reason"] for e in events_of(world.events(b), "agent.status")]
    assert "sandbox slot granted" in reasons

    # Now a prompt to a waits while b holds the slot, then brings a back.
    world.send(a, "prompt", "say: a again")

    def a_waits():
        reason = world.get(f"/api/agents/{a}")["status_reason"]
        return reason if reason.startswith("waiting for a sandbox slot") else None

    _wait(world, a_waits, "a to wait for the slot b holds")
    _wait(world, lambda: len(events_of(world.events(a), "turn.finished")) >= 2, "a's second turn")
    assert events_of(world.events(b), "agent.unloaded")
    rungs = [e["data"]["rung"] for e in events_of(world.events(a), "agent.restored")]
    assert rungs and rungs[-1] in ("restart", "resume"), rungs


@pytest.mark.live
def test_the_stream_quota_over_http(server):
    world = world_with(server, max_streams_per_user=2)
    agent = world.spawn({"model": "demo"})
    url = f"{world.url}/api/agents/{agent}/stream"
    with SSEStream(url, world.actor.auth) as one, SSEStream(url, world.actor.auth) as two:
        assert one.status == two.status == 200
        r = httpx.get(url, headers=world.actor.auth, timeout=10)
        assert r.status_code == 429 and r.headers["content-type"] == "application/json"
        assert r.json()["code"] == "quota.streams" and r.headers["Retry-After"] == "10"
    deadline = time.monotonic() + 10
    while True:  # the server notices the two closed connections
        with SSEStream(url, world.actor.auth) as three:
            if three.status == 200:
                break
        assert time.monotonic() < deadline, "closed streams did not give their places back"
        time.sleep(0.2)
