"""Denying a held credential, for real (issue 15, Build 2): an operator refuses
the credentials an agent waits for, with a reason; the agent cannot start
without them, so the worker ends it as lost with who and why — at its first
start, and when its sandbox is gone and the replacement waits. Its queued
prompt fails visibly; no sandbox is made. Both backends (tests/integration/worlds.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.test_approvals import HOLD
from tests.integration.test_credentials import store_secret
from tests.integration.test_ladder import remove_sandbox
from tests.integration.worlds import events_of


@pytest.fixture(scope="module", autouse=True)
def _actor_operates(world):
    world.server.grant(world.actor)


def _post(world, agent: str, verb: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(f"{world.url}/api/agents/{agent}/{verb}", json=body or {},
                      headers=world.actor.auth, timeout=30)


def _requested(evs, reason: str):
    return [e for e in events_of(evs, "credential.approval_requested") if e["data"]["reason"] == reason]


def _lost(world, agent: str) -> list[dict]:
    return world.wait_for(agent, lambda evs: events_of(evs, "agent.lost"), "agent.lost")


def test_denied_at_its_first_start_the_agent_ends_lost_and_its_prompt_fails(world):
    store_secret(world, "tok", "deny-canary")
    agent = world.spawn(HOLD, "say: never")
    world.wait_for(agent, lambda evs: _requested(evs, "first_start"), "an approval request")
    r = _post(world, agent, "deny", {"reason": "nobody asked for a deploy today"})
    assert r.status_code == 202, r.text
    events = _lost(world, agent)
    denied = events_of(events, "credential.denied")[0]["data"]
    assert (denied["by"], denied["reason"], denied["bindings"]) == (
        world.actor.username, "nobody asked for a deploy today", ["tok"])
    lost = events_of(events, "agent.lost")[0]["data"]
    assert lost["reason"] == (f"credential(s) tok denied by {world.actor.username}: "
                              "nobody asked for a deploy today")
    assert not events_of(events, "agent.sandbox") and not events_of(events, "turn.started")
    world.wait_for(agent, lambda evs: events_of(evs, "command.failed"), "the prompt failed")
    detail = world.get(f"/api/agents/{agent}")
    assert detail["status"] == "lost" and detail["sandbox_id"] is None, detail
    assert _post(world, agent, "approve").status_code == 409


def test_denied_while_its_sandbox_is_replaced_the_agent_ends_lost(world):
    store_secret(world, "tok", "deny-canary-2")
    agent = world.spawn(HOLD, "say: first")
    world.wait_for(agent, lambda evs: _requested(evs, "first_start"), "an approval request")
    assert _post(world, agent, "approve").status_code == 202
    world.wait_turns(agent, 1)
    remove_sandbox(world, world.get(f"/api/agents/{agent}")["sandbox_id"])
    world.wait_for(agent, lambda evs: _requested(evs, "sandbox_replaced"), "a second request")
    assert _post(world, agent, "deny", {"reason": "rotated"}).status_code == 202
    events = _lost(world, agent)
    assert events_of(events, "agent.lost")[0]["data"]["reason"].endswith(": rotated")
    assert not events_of(events, "agent.restored")
    assert world.get(f"/api/agents/{agent}")["status"] == "lost"
