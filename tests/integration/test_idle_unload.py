"""Idle unload: an agent quiet for ALINEO_IDLE_UNLOAD_S has its sandbox
stopped; the watcher leaves it stopped; a prompt brings it back on its session
(`session_start` fires again with source "resume"), with the same home."""

from __future__ import annotations

import time

import pytest

from sandboxes.backends.base import SandboxStatus
from tests.integration.test_approvals import HOLD
from tests.integration.test_credentials import store_secret
from tests.integration.worlds import (
    LABEL, WAIT, World, cleanup_sandboxes, ensure_docker, events_of, assert_sound, wait_looked_at)
from tests.live import LiveServer


@pytest.fixture(scope="module", params=["local", "docker"])
def idle_world(request):
    kind = request.param
    if kind == "docker":
        ensure_docker()
    server = LiveServer(env={"ALINEO_SANDBOX": kind, "ALINEO_SANDBOX_LABELS": LABEL,
                             "ALINEO_IDLE_UNLOAD_S": "2"})
    server.start()
    try:
        yield World(server, server.create_actor("olivia"), kind)
    finally:
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)


def _sandbox_state(world, sandbox_id):
    if world.kind == "docker":
        from sandboxes.backends.docker import DockerBackend

        return DockerBackend().status(sandbox_id)
    from sandboxes.backends.local import LocalBackend

    return LocalBackend(root=world.server.data_dir / "sandboxes").status(sandbox_id)


def test_an_idle_agent_is_unloaded_and_a_prompt_brings_it_back(idle_world):
    world = idle_world
    spec = {"model": "demo", "hooks": {"session_start": "echo started"}}
    agent = world.spawn(spec, "write notes.txt: kept")
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.unloaded"), "the unload")
    sandbox = world.get(f"/api/agents/{agent}")["sandbox_id"]
    assert world.get(f"/api/agents/{agent}")["status_reason"] == "unloaded"
    deadline = time.monotonic() + WAIT
    while _sandbox_state(world, sandbox) is SandboxStatus.RUNNING:
        assert time.monotonic() < deadline, "the sandbox was not stopped"
        time.sleep(0.2)
    # The watcher runs in the worker's scans: it must leave an unloaded agent
    # alone. A witness whose held credential keeps it waiting is taken up at
    # every scan (its lease re-claimed); three of them since, and the watcher
    # has had its look.
    store_secret(world, "tok", "witness-secret")
    witness = world.spawn(HOLD, "say: never runs")
    world.wait_for(witness, lambda evs: events_of(evs, "credential.approval_requested"),
                   "the witness waiting for approval")
    wait_looked_at(world, witness, times=3)
    assert _sandbox_state(world, sandbox) is not SandboxStatus.RUNNING
    assert not events_of(world.events(agent), "agent.restored")

    world.send(agent, "prompt", "run: cat notes.txt")
    events = world.wait_turns(agent, 2)
    restored = events_of(events, "agent.restored")
    assert restored and restored[-1]["data"]["rung"] in ("restart", "resume")
    assert world.get(f"/api/agents/{agent}")["sandbox_id"] == sandbox  # the same sandbox, woken
    output = next(e["data"]["output"] for e in events_of(events, "tool.result")
                  if e["data"].get("turn") == 2)
    assert "kept" in output
    sources = [e["data"].get("source") for e in events_of(events, "hook.verdict")
               if e["data"].get("hook") == "session_start"]
    assert sources[:1] == ["startup"] and sources[-1] == "resume"
    assert_sound(events)
