"""The restore ladder, for real (sandboxes/ladder.py): a live server drives
agents on BOTH backends (the `world` fixture of tests/integration/conftest.py); the faults are injected
from outside — the sandbox removed (`docker rm -f` / the local sandbox
removed), the bridge process killed inside a live sandbox, the server killed
with SIGKILL — and the transcript must show the rung taken, settle every turn
exactly once, and keep working. Waits are bounded; nothing asserts on speed.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.bseqs import bseq_trouble
from tests.integration.worlds import DEMO, World, count_of, events_of, remove_sandbox


CHECKPOINTED = {"model": "demo", "checkpoint": True}


def assert_sound(events: list[dict]) -> None:
    """seq 1, 2, 3 … with no gap and no repeat; each bridge event (bseq) once
    per bridge life and with no gap (tests/bseqs.py): a restore or rebuild
    starts the bridge's numbering again (a restored session file, or a new
    session), and so do the facts that say so."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    trouble = bseq_trouble(events)
    assert not trouble, trouble


def restored(events, rung: str | None = None) -> list[dict]:
    return [e for e in events_of(events, "agent.restored") if rung is None or e["data"]["rung"] == rung]


def settled_once(events) -> None:
    """Every turn that started settled exactly once (finished or interrupted)."""
    started = [e["data"]["turn"] for e in events_of(events, "turn.started")]
    ends = [e["data"]["turn"] for e in events if e["type"] in ("turn.finished", "turn.interrupted")]
    assert sorted(started) == sorted(ends), (started, ends)
    assert len(ends) == len(set(ends)), f"a turn settled twice: {ends}"
    calls = [e["data"]["tool_call_id"] for e in events_of(events, "tool.dispatched")]
    results = [e["data"]["tool_call_id"] for e in events_of(events, "tool.result")]
    assert sorted(calls) == sorted(results), "a tool call has no result (or two)"


def sandbox_of(w: World, agent: str) -> str:
    sid = w.get(f"/api/agents/{agent}")["sandbox_id"]
    assert sid
    return sid


_KILL_BRIDGE = (
    "import os\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit() and int(p) not in (1, os.getpid()):\n"
    "        try:\n"
    "            cmd = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
    "        except OSError:\n"
    "            continue\n"
    "        if b'-m' in cmd and b'bridge' in cmd:\n"
    "            os.kill(int(p), 9)\n"
)


def kill_bridge(w: World, sid: str) -> None:
    """SIGKILL the bridge inside a live sandbox. Docker: `docker exec` a kill
    (the bridge runs under docker-init, so the container exits with it);
    local: the sandbox's recorded pid."""
    if w.kind == "docker":
        import docker

        client = docker.from_env()
        try:
            exec_id = client.api.exec_create(sid, ["python3", "-c", _KILL_BRIDGE])["Id"]
            client.api.exec_start(exec_id)
        finally:
            client.close()
    else:
        info = json.loads((w.server.data_dir / "sandboxes" / sid / "pid").read_text())
        os.kill(info.get("command") or info["pid"], signal.SIGKILL)  # the bridge (bubblewrap: not its init)


def sleeping(evs) -> bool:
    return any(e["type"] == "tool.dispatched" and "sleep" in json.dumps(e["data"].get("input"))
               for e in evs)


# --- the suite ------------------------------------------------------------------------------


def test_a_removed_sandbox_is_restored_from_its_checkpoint(world):
    agent = world.spawn(CHECKPOINTED, "write notes.txt: kept across the loss\nspawn: say: a child")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    child = events_of(world.events(agent), "agent.child_spawned")[0]["data"]["child"]
    old = sandbox_of(world, agent)
    remove_sandbox(world, old)
    world.send(agent, "prompt", "run: cat notes.txt")
    events = world.wait_turns(agent, 2)
    rungs = restored(events)
    assert [r["data"]["rung"] for r in rungs] == ["restore"], rungs
    data = rungs[0]["data"]
    assert data["old_sandbox_id"] == old and data["new_sandbox_id"] != old
    assert data["reason"] == "sandbox_missing" and data["checkpoint_turn"] == 1
    assert sandbox_of(world, agent) == data["new_sandbox_id"]
    cat = events_of(events, "tool.result")[-1]["data"]
    assert "kept across the loss" in cat["output"] and cat["exit_code"] == 0
    assert [e["data"]["turn"] for e in events_of(events, "turn.finished")] == [1, 2]
    assert_sound(events)
    settled_once(events)
    # The tree survives the rung: the child still has its parent, and the
    # restored parent can still be prompted and spawn.
    listed = {a["id"]: a for a in world.get("/api/agents?limit=200")["agents"]}
    assert listed[child]["parent"] == agent and child in listed[agent]["children"]
    world.send(agent, "prompt", "spawn: say: a second child")
    events = world.wait_turns(agent, 3)
    assert count_of(events, "agent.child_spawned") == 2


def test_without_a_checkpoint_the_bridge_is_rebuilt_from_the_transcript(world):
    agent = world.spawn(DEMO, "say: first")
    world.wait_turns(agent, 1)
    world.send(agent, "prompt", "run: echo second")
    world.wait_turns(agent, 2)
    old = sandbox_of(world, agent)
    remove_sandbox(world, old)
    world.send(agent, "prompt", "say: third")
    events = world.wait_turns(agent, 3)
    rungs = restored(events)
    assert [(r["data"]["rung"], r["data"]["reason"]) for r in rungs] == [("rebuild", "no_checkpoint")]
    assert rungs[0]["data"]["old_sandbox_id"] == old
    assert rungs[0]["data"]["new_sandbox_id"] == sandbox_of(world, agent) != old
    # The new bridge was seeded with both earlier turns (2 prompts, 2 final
    # answers, one tool call and its result) and numbers the next turn after them.
    seeded = events_of(events, "session.seeded")
    assert len(seeded) == 1 and seeded[0]["data"]["turns"] == 2
    assert seeded[0]["data"]["messages"] >= 6
    assert [e["data"]["turn"] for e in events_of(events, "turn.finished")] == [1, 2, 3]
    assert "third" in events_of(events, "turn.finished")[-1]["data"]["text"]
    assert_sound(events)
    settled_once(events)


def test_an_expired_checkpoint_is_not_restored_the_agent_is_rebuilt(world):
    agent = world.spawn(CHECKPOINTED, "write old.txt: stale")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    world.server.django(
        "from datetime import timedelta\n"
        "from django.utils import timezone\n"
        "from sessions.models import Checkpoint\n"
        f"Checkpoint.objects.filter(agent_id={agent!r}).update(\n"
        "    expires_at=timezone.now() - timedelta(seconds=1))\n"
        "result = None\n")
    remove_sandbox(world, sandbox_of(world, agent))
    world.send(agent, "prompt", "run: cat old.txt || echo gone")
    events = world.wait_turns(agent, 2)
    assert [(r["data"]["rung"], r["data"]["reason"]) for r in restored(events)] == \
        [("rebuild", "checkpoint_expired")]
    assert "gone" in events_of(events, "tool.result")[-1]["data"]["output"]
    assert_sound(events)
    settled_once(events)


def test_a_sandbox_removed_mid_turn_settles_the_turn_once(world):
    agent = world.spawn(CHECKPOINTED, "write a.txt: one")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    world.send(agent, "prompt", "run: echo started\nsleep: 5")
    world.wait_for(agent, sleeping, "the sleep step")
    remove_sandbox(world, sandbox_of(world, agent))
    events = world.wait_for(agent, lambda evs: count_of(evs, "turn.interrupted") >= 1,
                            "the lost turn settled")
    world.send(agent, "prompt", "run: cat a.txt")
    events = world.wait_turns(agent, 2)
    interrupted = events_of(events, "turn.interrupted")
    assert len(interrupted) == 1
    assert interrupted[0]["data"]["turn"] == 2 and interrupted[0]["data"]["reason"] == "sandbox_lost"
    dangling = [e for e in events_of(events, "tool.result") if e["data"].get("interrupted")]
    assert dangling and all(e["data"]["exit_code"] == -1 for e in dangling)
    assert [r["data"]["rung"] for r in restored(events)] == ["restore"]
    assert [e["data"]["turn"] for e in events_of(events, "turn.finished")] == [1, 3]
    assert "one" in events_of(events, "tool.result")[-1]["data"]["output"]
    assert_sound(events)
    settled_once(events)


def test_a_checkpoint_taken_mid_turn_is_restored_and_its_turn_settles_once(world):
    """A checkpoint (on request) taken while a turn runs holds that turn as
    the session's current one: after the sandbox is lost, the restored bridge
    settles it itself (`bridge_restarted`), so the ladder must not settle it
    too (`skip_turn`, sessions/worker/ladder.py) — the turn settles once, and
    what the turn wrote before the checkpoint is in the new home."""
    agent = world.spawn(CHECKPOINTED, "say: hello")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    world.send(agent, "prompt", "write mid.txt: before the checkpoint\nsleep: 30")
    world.wait_for(agent, sleeping, "the sleep step")
    assert world.post(f"/api/agents/{agent}/checkpoints", {}).status_code == 202
    events = world.wait_for(agent, lambda evs: any(
        e["type"] == "agent.checkpointed" and "command" in e["data"] for e in evs),
        "the checkpoint taken mid-turn")
    mid = [e["data"] for e in events_of(events, "agent.checkpointed") if "command" in e["data"]]
    assert mid[0]["turn"] == 2 and unsettled(events) == [2]
    remove_sandbox(world, sandbox_of(world, agent))
    events = world.wait_for(agent, lambda evs: restored(evs) and not unsettled(evs),
                            "the restore, and turn 2 settled")
    assert [(r["data"]["rung"], r["data"]["checkpoint"]) for r in restored(events)] == [
        ("restore", mid[0]["checkpoint"])]
    world.send(agent, "prompt", "run: cat mid.txt")
    events = world.wait_turns(agent, 2)  # turns 1 and 3 finish; 2 was interrupted
    assert "before the checkpoint" in events_of(events, "tool.result")[-1]["data"]["output"]
    interrupted = events_of(events, "turn.interrupted")
    assert [(d["data"]["turn"], d["data"]["reason"]) for d in interrupted] == [
        (2, "bridge_restarted")], interrupted
    assert_sound(events)
    settled_once(events)


def unsettled(events) -> list[int]:
    started = {e["data"]["turn"] for e in events_of(events, "turn.started")}
    ended = {e["data"]["turn"] for e in events if e["type"] in ("turn.finished", "turn.interrupted")}
    return sorted(started - ended)


def test_a_killed_bridge_is_resumed_and_its_turn_settles_once(world):
    agent = world.spawn(DEMO, "say: hello")
    world.wait_turns(agent, 1)
    sid = sandbox_of(world, agent)
    world.send(agent, "prompt", "sleep: 5")
    world.wait_for(agent, sleeping, "the sleep step")
    kill_bridge(world, sid)
    events = world.wait_for(agent, lambda evs: count_of(evs, "turn.interrupted") >= 1,
                            "the interrupted turn")
    world.send(agent, "prompt", "say: after the kill")
    events = world.wait_turns(agent, 2)
    # Docker: the container exits with its bridge (docker-init), so the rung is
    # `restart`; a worker that looked before docker-init had exited finds the
    # container still running and resumes the bridge in it. Both keep the
    # sandbox and its disk (asserted below); anything harsher is a failure.
    gentle = ("restart", "resume") if world.kind == "docker" else ("resume",)
    rungs = restored(events)
    assert len(rungs) == 1 and rungs[0]["data"]["rung"] in gentle, rungs
    assert rungs[0]["data"]["old_sandbox_id"] == rungs[0]["data"]["new_sandbox_id"] == sid
    interrupted = events_of(events, "turn.interrupted")
    assert len(interrupted) == 1 and interrupted[0]["data"]["reason"] == "bridge_restarted"
    assert sandbox_of(world, agent) == sid
    assert_sound(events)
    settled_once(events)


def test_the_watcher_restores_a_removed_sandbox_without_a_prompt(world):
    agent = world.spawn(CHECKPOINTED, "write w.txt: watched")
    world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "a checkpoint")
    old = sandbox_of(world, agent)
    remove_sandbox(world, old)
    events = world.wait_for(agent, lambda evs: len(restored(evs)) >= 1, "a restore, unprompted")
    assert restored(events)[0]["data"]["rung"] == "restore"
    assert sandbox_of(world, agent) != old
    world.send(agent, "prompt", "run: cat w.txt")
    events = world.wait_turns(agent, 2)
    assert "watched" in events_of(events, "tool.result")[-1]["data"]["output"]
    assert len(restored(events)) == 1
    assert_sound(events)


def test_after_a_control_plane_kill_idle_agents_are_reattached(world):
    """Last in the module: it restarts the module's server."""
    agent = world.spawn(DEMO, "say: before")
    world.wait_turns(agent, 1)
    sid = sandbox_of(world, agent)
    world.server.restart(hard=True)
    events = world.wait_for(agent, lambda evs: len(restored(evs)) >= 1, "the reattach fact")
    rungs = restored(events)
    assert [(r["data"]["rung"], r["data"]["reason"]) for r in rungs] == \
        [("reattach", "control_plane_restart")]
    assert rungs[0]["data"]["old_sandbox_id"] == rungs[0]["data"]["new_sandbox_id"] == sid
    world.send(agent, "prompt", "say: after")
    events = world.wait_turns(agent, 2)
    assert count_of(events, "agent.sandbox") == 1 and sandbox_of(world, agent) == sid
    assert len(restored(events)) == 1
    assert_sound(events)
    settled_once(events)


@pytest.fixture(autouse=True)
def _server_alive(world):
    """A failed test must not leave the module's server dead for the next."""
    yield
    if world.server.proc is None or world.server.proc.poll() is not None:
        world.server.start()
