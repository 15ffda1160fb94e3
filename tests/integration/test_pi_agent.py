"""A Pi agent end to end, on both backends: the real Pi from npm (installed
once, bound read-only into the sandbox, network none) driven through the JSON
API against the demo model at the gateway. Its tool calls and results reach
the transcript and the agent page; a lost sandbox is restored from the turn checkpoint with Pi's
session file and the files it wrote; a fork from a checkpoint continues Pi's
conversation; an idle Pi agent is unloaded and a prompt wakes it on its
session. (A killed bridge, with Pi resumed on its session: tests/faults/
test_pi_faults.py, bridge_killed, on both backends.)"""

from __future__ import annotations

import httpx
import pytest

from sandboxes.harnesses import HARNESS_DIR, ensure_pi
from tests.integration.test_idle_unload import idle_world  # noqa: F401 - a fixture
from tests.integration.test_ladder import restored, sandbox_of, settled_once
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


def test_a_fork_from_a_checkpoint_continues_pis_conversation(world):
    source = world.spawn(PI, "write notes.txt: from the source")
    events = world.wait_for(source, lambda evs: count_of(evs, "agent.checkpointed") >= 1,
                            "the first checkpoint")
    checkpoint = events_of(events, "agent.checkpointed")[0]["data"]["checkpoint"]
    source_tokens = _calls_input_tokens(events)
    r = world.post(f"/api/agents/{source}/fork", {"checkpoint": checkpoint,
                                                  "prompt": "run: cat notes.txt"})
    assert r.status_code == 201, r.text
    child = world.wait_turns(r.json()["id"], 1)
    assert events_of(child, "agent.forked")[0]["data"]["rung"] == "restore"
    assert events_of(child, "bridge.started")[-1]["data"]["harness"] == "pi"
    cat = next(e["data"] for e in events_of(child, "tool.result") if e["data"]["name"] == "bash")
    assert cat["output"].startswith("from the source")
    # The child's Pi asked with the source's conversation (its session file
    # came with the checkpoint): its first call carries all the source's turn did.
    child_tokens = _calls_input_tokens(child)
    assert child_tokens[0] > max(source_tokens), (source_tokens, child_tokens)
    assert_sound(child)
    settled_once(child)


def test_an_idle_pi_agent_is_unloaded_and_a_prompt_wakes_it_on_its_session(idle_world):
    world = idle_world
    agent = world.spawn({**PI, "checkpoint": False, "hooks": {"session_start": "echo started"}},
                        "write idle.txt: kept by pi")
    world.wait_for(agent, lambda evs: events_of(evs, "agent.unloaded"), "the unload")
    sandbox = world.get(f"/api/agents/{agent}")["sandbox_id"]
    assert world.get(f"/api/agents/{agent}")["status_reason"] == "unloaded"
    world.send(agent, "prompt", "run: cat idle.txt")
    events = world.wait_turns(agent, 2)
    assert restored(events)[-1]["data"]["rung"] in ("restart", "resume")
    assert world.get(f"/api/agents/{agent}")["sandbox_id"] == sandbox  # woken, not replaced
    cat = next(e["data"] for e in events_of(events, "tool.result") if e["data"]["turn"] == 2)
    assert cat["output"].startswith("kept by pi")
    tokens = _calls_input_tokens(events)
    assert tokens[2] > tokens[1], tokens  # Pi woke on its session file: turn 1 came along
    sources = [e["data"].get("source") for e in events_of(events, "hook.verdict")
               if e["data"].get("hook") == "session_start"]
    assert sources[:1] == ["startup"] and sources[-1] == "resume"
    assert_sound(events)
