"""The worker, for real: a live server (manage.py serve) drives agents through
the supervisor, drivers and the in-sandbox bridge, on BOTH backends (the same
suite, parametrised). Everything goes through the JSON API; the database is
only read (Checkpoint rows) and files are only looked at.

Docker needs an engine: under CI a missing engine FAILS, elsewhere the docker
half is skipped loudly (the pattern of tests/integration/sandboxes/conftest.py).
Every sandbox a server creates is labelled alineo.test=<run id> and removed at
the end, containers and local process groups alike.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.worlds import (  # noqa: F401  (shared with other suites)
    DEMO,
    LABEL,
    WAIT,
    World,
    cleanup_sandboxes,
    command_state,
    count_of,
    ensure_docker,
    events_of,
    start_server,
    assert_sound,
)


# --- the suite ------------------------------------------------------------------------------


def test_a_demo_turn_end_to_end(world):
    agent = world.spawn(DEMO, "write notes.txt: hello\nrun: cat notes.txt")
    events = world.wait_turns(agent, 1)
    types = [e["type"] for e in events]
    for needed in ("agent.spawned", "command.prompt", "agent.sandbox", "turn.started",
                   "message.user", "tool.dispatched", "tool.result", "message.assistant",
                   "turn.finished"):
        assert needed in types, f"{needed} missing from {types}"
    assert types.index("turn.started") < types.index("message.user") < types.index("turn.finished")
    dispatched = {e["data"]["tool_call_id"]: e for e in events_of(events, "tool.dispatched")}
    results = {e["data"]["tool_call_id"]: e for e in events_of(events, "tool.result")}
    assert dispatched.keys() == results.keys() and len(dispatched) == 2
    cat = next(r for r in results.values() if r["data"]["name"] == "bash")
    assert "hello" in cat["data"]["output"] and cat["data"]["exit_code"] == 0
    assert_sound(events)

    # A second prompt continues the same agent (same sandbox, next turn).
    world.send(agent, "prompt", "run: cat notes.txt")
    events = world.wait_turns(agent, 2)
    finished = events_of(events, "turn.finished")
    assert [f["data"]["turn"] for f in finished] == [1, 2]
    assert count_of(events, "agent.sandbox") == 1
    assert_sound(events)
    detail = world.get(f"/api/agents/{agent}")
    assert detail["status"] == "idle" and detail["sandbox_id"]


def test_a_spawn_directive_makes_a_child_that_runs(world):
    parent = world.spawn(DEMO, "spawn: say: hi from the child")
    events = world.wait_turns(parent, 1)
    spawned = events_of(events, "agent.child_spawned")
    assert len(spawned) == 1
    child = spawned[0]["data"]["child"]
    result = next(e for e in events_of(events, "tool.result") if e["data"]["name"] == "spawn")
    assert child in result["data"]["output"] and not result["data"]["is_error"]
    listed = {a["id"]: a for a in world.get("/api/agents?limit=200")["agents"]}
    assert listed[child]["parent"] == parent
    assert child in listed[parent]["children"]
    child_events = world.wait_turns(child, 1)
    assert events_of(child_events, "agent.spawned")[0]["data"]["parent"] == parent
    assert "hi from the child" in events_of(child_events, "turn.finished")[0]["data"]["text"]
    assert_sound(child_events)


def test_a_steer_mid_turn_is_delivered(world):
    agent = world.spawn(DEMO, "sleep: 3")
    world.wait_for(agent, lambda evs: count_of(evs, "tool.dispatched") >= 1, "the sleep step")
    world.send(agent, "steer", "say: steered")
    events = world.wait_turns(agent, 1)
    delivered = events_of(events, "steer.delivered")
    assert len(delivered) == 1 and delivered[0]["data"]["text"] == "say: steered"
    assert events_of(events, "steer.delivered")[0]["seq"] < events_of(events, "turn.finished")[0]["seq"]
    assert_sound(events)


def test_a_steer_with_no_running_turn_fails_visibly(world):
    agent = world.spawn(DEMO, "say: done")
    world.wait_turns(agent, 1)
    command = world.send(agent, "steer", "too late")["command"]
    events = world.wait_for(agent, lambda evs: count_of(evs, "command.failed") >= 1, "command.failed")
    failed = events_of(events, "command.failed")[0]["data"]
    assert failed["command"] == command and failed["code"] == "no_turn"


def test_turn_checkpoints_are_taken_and_rotate_to_three(world):
    agent = world.spawn({"model": "demo", "checkpoint": True}, "write a.txt: one")
    world.wait_turns(agent, 1)
    world.send(agent, "prompt", "write b.txt: two")
    events = world.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 2,
                            "two checkpoints")
    cps = events_of(events, "agent.checkpointed")
    assert [c["data"]["turn"] for c in cps] == [1, 2]
    assert all(c["data"]["bytes"] > 0 for c in cps)
    rows = _checkpoint_rows(world, agent)
    assert {r["turn"] for r in rows} == {1, 2} and all(r["through_seq"] > 0 for r in rows)
    for n in (3, 4):
        world.send(agent, "prompt", f"write f{n}.txt: {n}")
        world.wait_for(agent, lambda evs, n=n: count_of(evs, "agent.checkpointed") >= n,
                       f"{n} checkpoints")
    folder = world.server.data_dir / "checkpoints" / agent
    files = sorted(p.name for p in folder.glob("*.tar.zst"))
    assert len(files) == 3, files
    rows = _checkpoint_rows(world, agent)
    live = sorted(r["turn"] for r in rows if r["deleted_at"] is None)
    assert live == [2, 3, 4] and len(rows) == 4
    assert count_of(world.events(agent), "agent.checkpoint_failed") == 0
    listed = world.get(f"/api/agents/{agent}/checkpoints")["checkpoints"]
    assert [c["state"] for c in listed] == ["live", "live", "live", "deleted"]
    assert all(len(c["harness_revision"]) == 16 and len(c["profile_revision"]) == 16 for c in listed)
    assert all(c["through_event_id"] for c in listed)


def test_stop_removes_the_sandbox(world):
    agent = world.spawn(DEMO, "say: hi")
    world.wait_turns(agent, 1)
    sandbox = world.get(f"/api/agents/{agent}")["sandbox_id"]
    assert sandbox
    world.send(agent, "stop")
    world.wait_for(agent, lambda evs: any(e["type"] == "agent.status" and
                                          e["data"].get("reason") == "sandbox removed"
                                          for e in evs), "the sandbox removed")
    assert world.get(f"/api/agents/{agent}")["status"] == "stopped"
    if world.kind == "docker":
        import docker

        client = docker.from_env()
        try:
            with pytest.raises(docker.errors.NotFound):
                client.api.inspect_container(sandbox)
        finally:
            client.close()
    else:
        assert not (world.server.data_dir / "sandboxes" / sandbox).exists()
        assert not _bridge_alive(agent)
    r = world.post(f"/api/agents/{agent}/prompt", {"text": "again"})
    assert r.status_code == 409


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_a_worker_crash_mid_turn_loses_and_repeats_nothing(kind):
    server = start_server(kind)
    server.start()
    try:
        actor = server.create_actor("oscar")
        w = World(server, actor, kind)
        agent = w.spawn(DEMO, "run: echo before\nsleep: 3\nrun: echo after")
        w.wait_for(agent, lambda evs: any(e["type"] == "tool.dispatched" and
                                          e["data"]["name"] == "bash" and "sleep" in
                                          json.dumps(e["data"]["input"]) for e in evs)
                   and count_of(evs, "tool.result") >= 1, "the sleep step")
        server.restart(hard=True)  # kill -9 mid-turn, then start on the same data dir
        events = w.wait_turns(agent, 1)
        assert_sound(events)
        assert count_of(events, "turn.finished") == 1 and count_of(events, "turn.interrupted") == 0
        assert count_of(events, "turn.started") == 1 and count_of(events, "agent.sandbox") == 1
        results = events_of(events, "tool.result")
        assert len(results) == 3 and "after" in results[-1]["data"]["output"]
        # The sleep's result was relayed after the restart: timed by the bridge's own clock.
        call = next(e for e in events_of(events, "tool.dispatched") if "sleep" in json.dumps(e["data"]))
        done = next(e for e in results if e["data"]["tool_call_id"] == call["data"]["tool_call_id"])
        took = datetime.fromisoformat(done["data"]["bridge_ts"]) - datetime.fromisoformat(call["data"]["bridge_ts"])
        assert took >= timedelta(seconds=3), took
        # And it keeps working afterwards.
        w.send(agent, "prompt", "say: still here")
        events = w.wait_turns(agent, 2)
        assert_sound(events)
    finally:
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)


# --- helpers ----------------------------------------------------------------------------


def _checkpoint_rows(world: World, agent: str) -> list[dict]:
    return world.server.django(
        "from sessions.models import Checkpoint\n"
        f"rows = Checkpoint.objects.filter(agent_id={agent!r}).order_by('id')\n"
        "result = [{'turn': r.turn, 'through_seq': r.through_seq, 'bytes': r.bytes,\n"
        "           'deleted_at': r.deleted_at and r.deleted_at.isoformat()} for r in rows]\n"
    )


def _bridge_alive(agent: str) -> bool:
    """Any process whose command line runs the bridge of this agent's run dir."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"/run/{agent}".encode() in environ and b"ALINEO_RUN_DIR" in environ:
            return True
    return False


def test_setup_runs_once_for_two_agents_of_one_spec(world):
    # Each build writes a fresh random id; two agents reading the same id share one build.
    spec = {"model": "demo", "setup": [
        "head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \\n' > ~/built-id; echo setup-ran"]}
    first = world.spawn(spec, "run: cat ~/built-id")
    second = world.spawn(spec, "run: cat ~/built-id")
    ids = []
    for agent in (first, second):
        events = world.wait_turns(agent, 1)
        result = next(e["data"] for e in events_of(events, "tool.result") if e["data"]["name"] == "bash")
        assert result["exit_code"] == 0, result
        ids.append(result["output"].strip())
    assert ids[0] and ids[0] == ids[1]


def test_a_failed_checkpoint_is_reported_and_is_not_a_failed_turn(world):
    agent = world.spawn({"model": "demo", "checkpoint": True}, "sleep: 2")
    blocker = world.server.data_dir / "checkpoints" / agent
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the checkpoint folder should be")  # the store cannot mkdir
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpoint_failed"), "checkpoint_failed")
    failed = events_of(events, "agent.checkpoint_failed")[0]["data"]
    assert failed["turn"] == 1 and failed["reason"]
    assert events_of(events, "turn.finished") and not events_of(events, "agent.checkpointed")
    assert world.get(f"/api/agents/{agent}")["status"] == "idle"
    blocker.unlink()
    world.send(agent, "prompt", "say: again")
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    assert events_of(events, "agent.checkpointed")[0]["data"]["turn"] == 2


def test_pause_holds_at_a_step_boundary_and_resume_goes_on(world):
    agent = world.spawn(DEMO, "sleep: 2")
    world.wait_for(agent, lambda evs: events_of(evs, "tool.dispatched"), "the sleep step")
    world.send(agent, "pause")
    events = world.wait_for(agent, lambda evs: events_of(evs, "turn.held"), "the turn held")
    assert not events_of(events, "turn.finished")  # the step in flight finished; the turn waits
    prompt = world.send(agent, "prompt", "say: after the pause")["command"]
    # A steer after it, which the worker delivers while paused: once it is
    # acted on, the worker has passed the prompt (commands go in id order).
    steer = world.send(agent, "steer", "say: steered while held")["command"]
    deadline = time.monotonic() + WAIT
    while command_state(world, int(steer)) == "pending":
        assert time.monotonic() < deadline, "the steer was never acted on"
        time.sleep(0.1)
    assert command_state(world, int(prompt)) == "pending"  # held back, not handed to the bridge
    events = world.events(agent)
    assert not events_of(events, "turn.finished") and world.get(f"/api/agents/{agent}")["status"] == "paused"
    world.send(agent, "resume")
    events = world.wait_turns(agent, 2)
    assert events_of(events, "turn.finished")[-1]["data"]["text"] == "[demo] after the pause"
    assert world.get(f"/api/agents/{agent}")["status"] == "idle"
    assert_sound(events)
