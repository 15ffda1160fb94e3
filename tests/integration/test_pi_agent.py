"""A Pi agent end to end, on both backends: the real Pi from npm (installed
once, bound read-only into the sandbox, network none) driven through the JSON
API against the demo model at the gateway. Its tool calls and results reach
the transcript and the agent page; a killed bridge is resumed and Pi continues
its session; a lost sandbox is restored from the turn checkpoint with Pi's
session file and the files it wrote."""

from __future__ import annotations

import httpx
import pytest

from sandboxes.harnesses import HARNESS_DIR, ensure_pi
from tests.integration.test_ladder import kill_bridge, restored, sandbox_of, settled_once
from tests.integration.worlds import assert_sound, count_of, events_of, remove_sandbox

PI = {"harness": "pi", "model": "demo", "checkpoint": True}


@pytest.fixture(scope="module", autouse=True)
def pi_installed():
    """Installed before the server needs it (only the first run of a machine downloads)."""
    return ensure_pi()


def _calls_input_tokens(events: list[dict]) -> list[int]:
    return [e["data"]["usage"]["input_tokens"] for e in events_of(events, "model.call")]


def test_a_pi_agent_writes_reads_and_survives_the_loss_of_its_sandbox(world):
    agent = world.spawn(PI, "write notes/a.txt: written by pi")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    world.send(agent, "prompt", "run: cat notes/a.txt")
    events = world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 2,
                            "a second checkpoint")
    started = events_of(events, "bridge.started")[0]["data"]
    assert started["harness"] == "pi"
    dispatched = [(e["data"]["name"], e["data"]["input"]) for e in events_of(events, "tool.dispatched")]
    assert dispatched == [("write", {"path": "notes/a.txt", "content": "written by pi"}),
                          ("bash", {"command": "cat notes/a.txt"})]
    cat = events_of(events, "tool.result")[-1]["data"]
    assert cat["output"].startswith("written by pi") and cat["exit_code"] == 0
    cookie = world.server.session_cookie(world.actor)
    page = httpx.get(f"{world.url}/agents/{agent}/", cookies={"sessionid": cookie}, timeout=30)
    assert page.status_code == 200 and "notes/a.txt" in page.text

    old = sandbox_of(world, agent)
    if world.kind == "docker":  # Pi is a layer of the image, not a host path the engine needs
        import docker

        client = docker.from_env()
        try:
            mounts = [m["Destination"] for m in client.api.inspect_container(old)["Mounts"]]
        finally:
            client.close()
        assert HARNESS_DIR not in mounts, mounts
    remove_sandbox(world, old)
    world.send(agent, "prompt", "run: cat notes/a.txt")
    events = world.wait_turns(agent, 3)
    assert [r["data"]["rung"] for r in restored(events)] == ["restore"]
    again = events_of(events, "tool.result")[-1]["data"]
    assert again["output"].startswith("written by pi") and again["exit_code"] == 0
    # Pi continued its session: the restored Pi's first call carries both earlier turns.
    tokens = _calls_input_tokens(events)
    assert tokens[-2] > tokens[2] > tokens[0], tokens
    assert [e["data"]["turn"] for e in events_of(events, "turn.finished")] == [1, 2, 3]
    assert count_of(events, "model.replayed") == 0
    assert_sound(events)
    settled_once(events)


def test_a_killed_bridge_is_resumed_and_pi_continues(world):
    agent = world.spawn(PI, "write k.txt: before the kill")
    world.wait_turns(agent, 1)
    kill_bridge(world, sandbox_of(world, agent))
    world.send(agent, "prompt", "run: cat k.txt")
    events = world.wait_turns(agent, 2)
    assert restored(events), "the ladder journals how the bridge came back"
    cat = events_of(events, "tool.result")[-1]["data"]
    assert cat["output"].startswith("before the kill")
    tokens = _calls_input_tokens(events)
    assert tokens[2] > tokens[0], tokens  # the conversation came back with Pi
    assert_sound(events)
    settled_once(events)
