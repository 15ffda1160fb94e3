"""Issue 17 end to end, on both backends (docker: an overlay volume,
sandboxes/backends/docker_trees.py; local: an id-mapped overlay,
sandboxes/backends/idmap.py): the worker prepares the tree of each turn
checkpoint in the background; after the sandbox's loss (``docker rm -f``, the
local sandbox removed) the restore rung lays the new home over it (no
extraction), and so does a fork from the newest checkpoint. The transcript
reads as for any restore."""

from __future__ import annotations

import json
import os
import time

from tests.integration.worlds import World, assert_sound, events_of, remove_sandbox

CHECKPOINTED = {"model": "demo", "checkpoint": True}


def _trees(w: World) -> set[str]:
    top = w.server.data_dir / "trees"
    return {p.name for p in top.iterdir() if not p.name.startswith((".", "seed-"))
            and (p / "root").is_dir()} if top.is_dir() else set()


def _wait_for_tree(w: World, known: set[str], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = _trees(w) - known
        if new:
            return new.pop()
        time.sleep(0.2)
    raise AssertionError(f"no tree was prepared within {timeout:g} s")


def _over_tree(w: World, agent: str) -> bool:
    """Whether the agent's sandbox has a home laid over a tree: a volume of
    its own (docker), a mounted overlay recorded in its meta (local)."""
    sid = w.get(f"/api/agents/{agent}")["sandbox_id"]
    if w.kind == "local":
        path = w.server.data_dir / "sandboxes" / sid
        return bool(json.loads((path / "meta.json").read_text()).get("tree")) and os.path.ismount(
            path / "home")
    import docker

    client = docker.from_env()
    try:
        mounts = client.api.inspect_container(sid)["Mounts"]
    finally:
        client.close()
    return any(m["Type"] == "volume" and m["Destination"] == "/root"
               and m["Name"].startswith(f"alineo-home-{agent}-") for m in mounts)


def test_a_restore_and_a_fork_lay_the_home_over_the_prepared_checkpoint(world):
    agent = world.spawn(CHECKPOINTED, "write notes.txt: kept across the loss")
    world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    tree = _wait_for_tree(world, set())
    old = world.get(f"/api/agents/{agent}")["sandbox_id"]
    assert not _over_tree(world, agent)  # a first sandbox's home is its image's
    remove_sandbox(world, old)
    world.send(agent, "prompt", "run: cat notes.txt; echo more >> notes.txt")
    events = world.wait_turns(agent, 2)
    rung = events_of(events, "agent.restored")[0]["data"]
    assert rung["rung"] == "restore" and rung["checkpoint_turn"] == 1
    assert _over_tree(world, agent)
    cat = events_of(events, "tool.result")[-1]["data"]
    assert cat["exit_code"] == 0 and "kept across the loss" in cat["output"]
    assert_sound(events)
    # The restored agent's own checkpoint (turn 2) is prepared in its turn;
    # the tree under its home stays while the home is laid over it.
    tree2 = _wait_for_tree(world, {tree})
    assert tree in _trees(world)

    checkpoint = events_of(world.events(agent), "agent.checkpointed")[-1]["data"]["checkpoint"]
    r = world.post(f"/api/agents/{agent}/fork", {"checkpoint": checkpoint, "prompt": "run: cat notes.txt"})
    assert r.status_code == 201, r.text
    child = r.json()["id"]
    child_events = world.wait_turns(child, 1)
    assert events_of(child_events, "agent.forked")[0]["data"]["rung"] == "restore"
    assert _over_tree(world, child)
    out = events_of(child_events, "tool.result")[-1]["data"]["output"]
    assert "kept across the loss" in out and "more" in out
    assert tree2 in _trees(world)
