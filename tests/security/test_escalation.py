"""Escalation through children and approvals (the issue "The sandbox is a
boundary"), tried as an attacker would, and refused.

The findings were: a model's `spawn` tool got a child bound to a workspace
credential its parent never had, with `approval: auto`; and a member approved
a held binding of their own agent. Now a child is never wider than its parent
(sessions/commands/lineage.py: 403 spawn.escalation, back to the tool as a
tool error) and approving takes a workspace operator (staff, or the
permission agent_sessions.approve_credentials: 403 approval.forbidden).

In process: the command the relay calls (commands.spawn_child), the relay's
answer to a `request.spawn`, and the JSON API. Live: a real server on the
local backend, where the demo model's `spawn: {"prompt", "spec"}` directive
makes the bridge send the request a real model would.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from sandboxes.bridge.protocol import BridgeEvent
from sessions import approvals, commands
from sessions.commands import lineage
from sessions.credentials import set_secret
from sessions.models import Agent, ApiToken, Command, Event
from sessions.worker.relay import Relay
from tests.integration.test_credentials import store_secret
from tests.integration.worlds import World, cleanup_sandboxes, events_of, start_server
from tests.unit.api.conftest import Caller, assert_error

TOK = {"name": "tok", "env": "TOK", "approval": "auto"}
HELD = {**TOK, "approval": "hold"}
NO_BASH = ["read", "write", "spawn", "memory"]


@pytest.fixture
def secrets(workspace):
    set_secret(workspace, "tok", "tok-secret-value")
    set_secret(workspace, "other", "other-secret-value")


@pytest.fixture
def owner_api(owner):
    return Caller(ApiToken.issue(owner)[1])


@pytest.fixture
def teammate_api(teammate):
    return Caller(ApiToken.issue(teammate)[1])


def spawned(api, spec: dict, **extra) -> str:
    r = api.post("/api/agents", {"spec": spec, **extra})
    assert r.status_code == 201, r.content
    return r.json()["id"]


def written() -> tuple[int, int, int]:
    return Agent.objects.count(), Command.objects.count(), Event.objects.count()


# --- what "no wider than the parent" covers --------------------------------------------------

WIDER = [
    ("a credential the parent never had", {"model": "demo"}, {"credentials": [TOK]},
     "credentials[0]"),
    ("a held binding made auto", {"credentials": [HELD]}, {"credentials": [TOK]},
     "credentials[0].approval"),
    ("a held binding whose approval is left out (auto)", {"credentials": [HELD]},
     {"credentials": [{"name": "tok", "env": "TOK"}]}, "credentials[0].approval"),
    ("the parent's credential in another variable", {"credentials": [HELD]},
     {"credentials": [{**HELD, "env": "ELSEWHERE"}]}, "credentials[0].env"),
    ("host network under none", {"model": "demo"}, {"network": "host"}, "network"),
    ("more memory", {"limits": {"memory_mb": 512}}, {"limits": {"memory_mb": 1024}},
     "limits.memory_mb"),
    ("more processes", {"limits": {"pids": 64}}, {"limits": {"pids": 65}}, "limits.pids"),
    ("more CPUs", {"limits": {"cpus": 0.5}}, {"limits": {"cpus": 1.0}}, "limits.cpus"),
    ("a tool the parent lacks", {"tools": NO_BASH}, {"tools": [*NO_BASH, "bash"]}, "tools"),
    ("root under a parent that is not", {"run_as": "agent"}, {"run_as": "root"}, "run_as"),
    ("the parent's guard hook changed", {"hooks": {"pre_tool_use": "exit 2"}},
     {"hooks": {"pre_tool_use": "true"}}, "hooks.pre_tool_use"),
    ("a hook (shell) under a parent without bash", {"tools": NO_BASH},
     {"hooks": {"session_start": "curl example.org"}}, "hooks.session_start"),
    ("a setup step (shell) under a parent without bash", {"tools": NO_BASH},
     {"setup": ["curl example.org"]}, "setup[0]"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("what, parent, child, field", WIDER, ids=[w[0] for w in WIDER])
def test_a_model_cannot_spawn_a_child_wider_than_its_parent(secrets, owner_api, what, parent,
                                                            child, field):
    parent_id = spawned(owner_api, {"model": "demo", **parent})
    before = written()
    with pytest.raises(commands.CommandRefused) as refused:
        commands.spawn_child(parent_id, "say: hi", child, f"bridge:{parent_id}:s:{field}")
    assert (refused.value.status, refused.value.code) == (403, "spawn.escalation")
    assert refused.value.extra["field"] == field
    assert f"spec.{field}" in refused.value.message and parent_id in refused.value.message
    assert written() == before  # no child, no command, no fact on the parent


@pytest.mark.django_db
@pytest.mark.parametrize("what, parent, child, field", WIDER, ids=[w[0] for w in WIDER])
def test_the_api_refuses_the_same_child_with_a_403_json(secrets, owner_api, teammate_api, what,
                                                        parent, child, field):
    parent_id = spawned(owner_api, {"model": "demo", **parent})
    before = written()
    body = assert_error(teammate_api.post("/api/agents", {"spec": child, "parent": parent_id}),
                        403, "spawn.escalation")
    assert body["field"] == field
    assert written() == before


NARROWER = [
    ("a held binding stays held", {"credentials": [HELD]}, {"credentials": [HELD]}),
    ("an auto binding may be held", {"credentials": [TOK]}, {"credentials": [HELD]}),
    ("fewer bindings", {"credentials": [TOK, {"name": "other", "env": "OTHER"}]},
     {"credentials": [TOK]}),
    ("fewer tools, less memory, no network", {"network": "host"},
     {"tools": ["read"], "limits": {"memory_mb": 256}, "network": "none"}),
    ("the parent's hook kept, one added under bash", {"hooks": {"pre_tool_use": "exit 0"}},
     {"hooks": {"stop": "echo done"}}),
    ("any user under root", {"run_as": "root"}, {"run_as": "agent"}),
]


@pytest.mark.django_db
@pytest.mark.parametrize("what, parent, child", NARROWER, ids=[n[0] for n in NARROWER])
def test_a_child_may_be_narrower(secrets, owner_api, what, parent, child):
    parent_id = spawned(owner_api, {"model": "demo", **parent})
    child_id = commands.spawn_child(parent_id, "say: hi", child, f"bridge:{parent_id}:s:1")
    assert Agent.objects.get(pk=child_id).parent_id == parent_id


@pytest.mark.django_db
def test_a_childs_spec_inherits_what_it_does_not_name(secrets, owner_api):
    parent_id = spawned(owner_api, {"model": "demo", "credentials": [HELD], "tools": NO_BASH,
                                    "limits": {"memory_mb": 512, "cpus": 0.5}})
    child_id = commands.spawn_child(parent_id, "say: hi", {"tools": ["read"],
                                                           "limits": {"memory_mb": 256}}, "k1")
    spec = Agent.objects.get(pk=child_id).spec
    assert spec["tools"] == ["read"] and spec["credentials"] == [HELD]
    assert spec["limits"] == {"memory_mb": 256, "pids": 512, "cpus": 0.5}
    # Nothing named: the parent's spec, exactly (and so never wider).
    again = commands.spawn_child(parent_id, "say: hi", None, "k2")
    assert Agent.objects.get(pk=again).spec == Agent.objects.get(pk=parent_id).spec


@pytest.mark.django_db
def test_a_fork_under_a_narrower_parent_is_refused(secrets, owner_api):
    wide = spawned(owner_api, {"model": "demo", "network": "host", "credentials": [TOK]})
    narrow = spawned(owner_api, {"model": "demo"})
    before = written()
    body = assert_error(owner_api.post(f"/api/agents/{wide}/fork", {"at_event": 1,
                                                                    "parent": narrow}),
                        403, "spawn.escalation")
    assert body["field"] == "credentials[0]"
    assert written() == before


def test_the_rule_is_pure_and_names_the_first_widening():
    parent = {"credentials": [HELD], "network": "none", "limits": {"memory_mb": 1},
              "tools": ["read"], "run_as": "root", "hooks": {}, "setup": []}
    assert lineage.widening(parent, parent) is None
    child = {**parent, "network": "host", "limits": {"memory_mb": 2}}
    assert lineage.widening(parent, child)[0] == "network"


# --- through the relay: the tool gets the error --------------------------------------------


class _Control:
    def __init__(self):
        self.replies: list[tuple[str, dict]] = []

    async def reply(self, request_id: str, **reply) -> None:
        self.replies.append((request_id, reply))


class _Link:
    def __init__(self):
        self.events, self.control = None, _Control()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_relay_answers_an_escalating_request_spawn_with_a_tool_error(workspace, owner):
    from channels.db import database_sync_to_async

    def setup() -> str:
        set_secret(workspace, "tok", "tok-secret-value")
        return commands.spawn(owner, {"spec": {"model": "demo"}}).body["id"]

    parent_id = await database_sync_to_async(setup)()
    link = _Link()
    relay = Relay(parent_id, link, 0, "sess-1")
    event = BridgeEvent(3, "request.spawn", "2026-12-01T00:00:00.000000Z", {
        "request_id": "req-call-1", "tool_call_id": "call-1", "prompt": "say: hi",
        "spec": {"credentials": [TOK]}})
    await relay.answer(event)
    [(request_id, reply)] = link.control.replies
    assert request_id == "req-call-1" and "result" not in reply
    assert reply["error"]["code"] == "spawn.escalation"
    assert reply["error"]["message"].startswith("spawn.escalation: A child may not be wider")
    count = database_sync_to_async(lambda: Agent.objects.filter(parent_id=parent_id).count())
    assert await count() == 0


# --- approvals: a member cannot release a held secret -------------------------------------


@pytest.mark.django_db
def test_a_member_cannot_approve_a_held_binding_of_their_own_agent(secrets, teammate_api):
    agent_id = spawned(teammate_api, {"model": "demo", "credentials": [HELD]})
    assert approvals.ensure_approved(agent_id, approvals.FIRST_START) is False  # it waits
    before = written()
    body = assert_error(teammate_api.post(f"/api/agents/{agent_id}/approve"), 403,
                        "approval.forbidden")
    assert "agent_sessions.approve_credentials" in body["message"]
    assert assert_error(teammate_api.post(f"/api/agents/{agent_id}/approve",
                                          {"bindings": ["tok"]}), 403)["code"] == \
        "approval.forbidden"
    assert written() == before
    assert not Event.objects.filter(agent_id=agent_id, type=approvals.APPROVED).exists()
    assert approvals.ensure_approved(agent_id, approvals.FIRST_START) is False  # still held


@pytest.mark.django_db
def test_an_operator_approves_and_the_fact_names_them(secrets, teammate_api, operator):
    agent_id = spawned(teammate_api, {"model": "demo", "credentials": [HELD]})
    approvals.ensure_approved(agent_id, approvals.FIRST_START)
    r = Caller(ApiToken.issue(operator)[1]).post(f"/api/agents/{agent_id}/approve")
    assert r.status_code == 202, r.content
    fact = Event.objects.get(agent_id=agent_id, type=approvals.APPROVED)
    assert fact.data["by"] == operator.username


@pytest.mark.django_db
def test_an_outsider_is_a_404_and_anonymous_a_401(secrets, teammate_api, outsider):
    agent_id = spawned(teammate_api, {"model": "demo", "credentials": [HELD]})
    approvals.ensure_approved(agent_id, approvals.FIRST_START)
    outsider_api = Caller(ApiToken.issue(outsider)[1])
    assert_error(outsider_api.post(f"/api/agents/{agent_id}/approve"), 404, "agent.not_found")
    assert_error(Caller(None).post(f"/api/agents/{agent_id}/approve"), 401)


# --- live: a real bridge request -------------------------------------------------------------


@pytest.fixture(scope="module")
def local_world():
    """A real server on the local backend (the rule does not depend on the backend)."""
    server = start_server("local")
    server.start()
    try:
        yield World(server, server.create_actor("mallory"), "local")
    finally:
        server.stop()
        cleanup_sandboxes(server, "local")
        server.__exit__(None, None, None)


def _spawn_line(spec: dict, prompt: str = "say: child") -> str:
    return "spawn: " + json.dumps({"prompt": prompt, "spec": spec})


def _spawn_results(events) -> list[dict]:
    return [e["data"] for e in events_of(events, "tool.result") if e["data"]["name"] == "spawn"]


def _children(world: World, agent: str) -> list[str]:
    return world.get(f"/api/agents/{agent}")["children"]


@pytest.mark.live
def test_a_models_spawn_of_a_child_with_a_credential_is_a_tool_error(local_world):
    world = local_world
    store_secret(world, "tok", "canary-" + uuid.uuid4().hex)
    parent = world.spawn({"model": "demo"}, _spawn_line({"credentials": [TOK]}) + "\n"
                         + _spawn_line({"network": "host"}))
    events = world.wait_turns(parent, 1)
    assert [e["data"].get("spec") for e in events_of(events, "request.spawn")] == [
        {"credentials": [TOK]}, {"network": "host"}]
    results = _spawn_results(events)
    assert len(results) == 2 and all(r["is_error"] and r["exit_code"] != 0 for r in results)
    assert all("spawn.escalation" in r["output"] for r in results), results
    assert "credentials[0]" in results[0]["output"] and "network" in results[1]["output"]
    assert not events_of(events, "agent.child_spawned") and _children(world, parent) == []
    assert events[-1]["type"] == "turn.finished"  # the turn went on: an error, not a crash


@pytest.mark.live
def test_a_held_parent_gets_only_held_children_and_a_member_cannot_approve(local_world):
    world = local_world
    store_secret(world, "tok", "canary-" + uuid.uuid4().hex)
    parent = world.spawn({"model": "demo", "credentials": [HELD]},
                         _spawn_line({"credentials": [TOK]}) + "\n"
                         + _spawn_line({"credentials": [HELD]}))
    world.wait_for(parent, lambda evs: events_of(evs, "credential.approval_requested"),
                   "the approval request")
    url = f"{world.url}/api/agents/{parent}/approve"
    r = httpx.post(url, json={}, headers=world.actor.auth, timeout=30)
    assert r.status_code == 403 and r.json()["code"] == "approval.forbidden", r.text
    world.server.grant(world.actor)  # an admin makes the actor an operator
    r = httpx.post(url, json={}, headers=world.actor.auth, timeout=30)
    assert r.status_code == 202, r.text
    events = world.wait_turns(parent, 1)
    refused, made = _spawn_results(events)
    assert refused["is_error"] and "spawn.escalation" in refused["output"]
    assert "credentials[0].approval" in refused["output"]
    assert not made["is_error"], made
    [child] = _children(world, parent)
    assert json.loads(made["output"]) == {"agent_id": child}
    # The child holds the same secret for an approval of its own.
    world.wait_for(child, lambda evs: events_of(evs, "credential.approval_requested"),
                   "the child's approval request")
    detail = world.get(f"/api/agents/{child}")
    assert detail["spec"]["credentials"] == [HELD] and detail["sandbox_id"] is None
    assert detail["status_reason"] == "waiting for approval of credential(s) tok"
