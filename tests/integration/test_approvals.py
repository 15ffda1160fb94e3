"""Held credentials, for real: a binding with "approval": "hold" keeps the
agent from getting a sandbox (and the secret) until an operator approves it
through the API, and a sandbox that disappears asks again instead of ending
lost. A live server drives the agent on both backends (the World of
tests/integration/worlds.py; docker is skipped loudly without an engine)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.integration.test_credentials import nowhere_but_the_credential_table, store_secret
from tests.integration.test_ladder import remove_sandbox, settled_once
from tests.integration.worlds import count_of, events_of, wait_looked_at


HOLD = {"model": "demo", "credentials": [{"name": "tok", "env": "TOK", "approval": "hold"}]}


@pytest.fixture(scope="module", autouse=True)
def _actor_operates(world):
    """Approving takes a workspace operator (the permission
    agent_sessions.approve_credentials): the world's actor is granted it."""
    world.server.grant(world.actor)


def _requests(events, reason: str | None = None) -> list[dict]:
    return [e for e in events_of(events, "credential.approval_requested")
            if reason is None or e["data"]["reason"] == reason]


def _approve(world, agent: str, body: dict | None = None, key: str | None = None) -> httpx.Response:
    headers = dict(world.actor.auth, **({"Idempotency-Key": key} if key else {}))
    return httpx.post(f"{world.url}/api/agents/{agent}/approve", json=body or {}, headers=headers,
                      timeout=30)


def _bash_outputs(events) -> list[str]:
    return [e["data"]["output"] for e in events_of(events, "tool.result") if e["data"]["name"] == "bash"]


def test_a_held_credential_waits_for_approval_and_asks_again_after_the_sandbox_is_gone(world):
    canary = "canary-" + uuid.uuid4().hex
    store_secret(world, "tok", canary)
    agent = world.spawn(HOLD, "run: echo first-${TOK:+set}")

    # 1. First start: the worker asks, and waits — no sandbox, the prompt stays pending.
    events = world.wait_for(agent, lambda evs: _requests(evs), "an approval request")
    req = _requests(events)[0]["data"]
    assert req["bindings"] == ["tok"] and req["reason"] == "first_start"
    wait_looked_at(world, agent)  # the worker took it up again (twice): still waiting, asked once
    detail = world.get(f"/api/agents/{agent}")
    assert detail["sandbox_id"] is None and detail["status"] == "starting"
    assert detail["status_reason"] == "waiting for approval of credential(s) tok"
    events = world.events(agent)
    assert len(_requests(events)) == 1
    assert not events_of(events, "agent.sandbox") and not events_of(events, "turn.started")

    # 2. Approve (idempotent by key): the sandbox starts with the secret and the prompt runs.
    first = _approve(world, agent, key=f"approve-{agent}-1")
    again = _approve(world, agent, key=f"approve-{agent}-1")
    assert first.status_code == again.status_code == 202, first.text
    assert again.json() == first.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert first.json()["bindings"] == ["tok"]
    events = world.wait_turns(agent, 1)
    assert len(events_of(events, "credential.approved")) == 1
    assert events_of(events, "credential.approved")[0]["data"]["by"] == world.actor.username
    assert any("first-set" in out for out in _bash_outputs(events)), _bash_outputs(events)
    # Nothing waits now: a further approval is refused.
    r = _approve(world, agent)
    assert r.status_code == 409 and r.json()["code"] == "approval.not_requested"

    # 3. The sandbox disappears: the ladder asks again instead of ending lost.
    sid = world.get(f"/api/agents/{agent}")["sandbox_id"]
    remove_sandbox(world, sid)
    events = world.wait_for(agent, lambda evs: _requests(evs, "sandbox_replaced"),
                            "a second approval request")
    assert _requests(events, "sandbox_replaced")[0]["data"]["bindings"] == ["tok"]
    world.send(agent, "prompt", "run: echo again-${TOK:+set}")
    wait_looked_at(world, agent)
    detail = world.get(f"/api/agents/{agent}")
    assert detail["status"] == "restoring", detail
    assert detail["status_reason"] == "waiting for approval of credential(s) tok"
    events = world.events(agent)
    assert not events_of(events, "agent.lost") and not events_of(events, "agent.restored")
    assert len(_requests(events, "sandbox_replaced")) == 1
    assert count_of(events, "turn.started") == 1

    # 4. Approve again: restored on a fresh sandbox (with the secret), and it answers the prompt.
    assert _approve(world, agent, {"bindings": ["tok"]}).status_code == 202
    events = world.wait_turns(agent, 2)
    rungs = [e["data"]["rung"] for e in events_of(events, "agent.restored")]
    assert rungs and rungs[-1] in ("restore", "rebuild"), rungs
    assert events_of(events, "agent.restored")[-1]["data"]["old_sandbox_id"] == sid
    assert not events_of(events, "agent.lost")
    assert any("again-set" in out for out in _bash_outputs(events)), _bash_outputs(events)
    settled_once(events)
    detail = world.get(f"/api/agents/{agent}")
    assert detail["sandbox_id"] not in (None, sid) and detail["status"] == "idle", detail
    nowhere_but_the_credential_table(world, canary)


def test_an_agent_without_held_credentials_starts_at_once(world):
    store_secret(world, "free-tok", "free-" + uuid.uuid4().hex)
    spec = {"model": "demo", "credentials": [{"name": "free-tok", "env": "FREE", "approval": "auto"}]}
    agent = world.spawn(spec, "run: echo ${FREE:+set}")
    events = world.wait_turns(agent, 1)
    assert not _requests(events)
    r = _approve(world, agent)
    assert r.status_code == 409 and r.json()["code"] == "approval.not_requested"
