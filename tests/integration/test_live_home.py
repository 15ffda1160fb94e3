"""The live home when the sandbox runs (issue 15, Build 6), end to end on
both backends: an agent writes a file mid-turn (its turn is still running,
so no checkpoint has it); a look taken through the API — the web process
journals it, the agent's worker reads the home out of the running sandbox —
shows the file, while the newest checkpoint does not; the Files page shows
it labelled live. A stopped agent's look is refused and wakes nothing."""

from __future__ import annotations

import time

import httpx

from sandboxes import home_files
from tests.integration.worlds import WAIT, db_value, events_of

SPEC = {"model": "demo", "checkpoint": True}


def _wait_command(world, command: int) -> dict:
    deadline = time.monotonic() + WAIT
    while True:
        body = world.get(f"/api/commands/{command}")
        if body["state"] != "pending":
            return body
        assert time.monotonic() < deadline, f"command {command} still pending"
        time.sleep(0.2)


def test_a_file_written_mid_turn_is_in_the_live_home_not_in_the_checkpoint(world):
    agent = world.spawn(SPEC, "write notes.txt: from turn one")
    world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "turn 1's checkpoint")
    world.send(agent, "prompt", "write live.txt: written mid-turn\nsleep: 60")
    world.wait_for(agent, lambda evs: any(e["data"].get("turn") == 2 for e in
                                          events_of(evs, "tool.result")), "the write of turn 2")
    r = world.post(f"/api/agents/{agent}/home-snapshot", {})
    assert r.status_code == 202, r.text
    done = _wait_command(world, r.json()["command"])
    assert done["state"] == "done", done
    look = world.get(f"/api/agents/{agent}/home-snapshot")["home_snapshot"]
    assert look["id"] == done["result"]["live_home"]
    live_path = db_value(world, "SELECT path FROM agent_sessions_livehome WHERE id = ?", [look["id"]])
    cp_path = db_value(world, "SELECT path FROM agent_sessions_checkpoint WHERE agent_id = ? "
                       "ORDER BY id DESC", [agent])
    live, checkpoint = home_files.listing(live_path).entries, home_files.listing(cp_path).entries
    assert "live.txt" in live and "notes.txt" in live
    assert "live.txt" not in checkpoint and "notes.txt" in checkpoint
    assert "/live-homes/" in live_path and "/checkpoints/" in cp_path
    cookie = world.server.session_cookie(world.actor)
    page = httpx.get(f"{world.url}/agents/{agent}/files?live=1&path=live.txt",
                     cookies={"sessionid": cookie}, timeout=30)
    assert page.status_code == 200 and 'id="live-label"' in page.text
    assert "written mid-turn" in page.text
    facts = [e["type"] for e in world.events(agent)]
    assert "agent.home_snapshot" in facts and "command.failed" not in facts
    # A stopped agent: refused, nothing woken.
    assert _wait_command(world, world.send(agent, "stop")["command"])["state"] == "done"
    r = world.post(f"/api/agents/{agent}/home-snapshot", {})
    assert r.status_code == 409 and r.json()["code"] == "agent.stopped"
