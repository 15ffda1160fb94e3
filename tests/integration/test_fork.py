"""Fork, for real, on both backends: from a checkpoint the new agent has that
checkpoint's disk; from an event it has the conversation on a fresh disk. The
source goes on untouched."""

from __future__ import annotations

from tests.integration.worlds import events_of


def _bash_output(events, turn):
    return next(e["data"]["output"] for e in events_of(events, "tool.result")
                if e["data"].get("turn") == turn and e["data"]["name"] == "bash")


def _assert_the_fork_command_is_done(world, command: int, child_events) -> None:
    """A fork that worked is a command that worked (it used to end
    failed/unknown_verb, with a red "Command failed · fork" row)."""
    assert world.get(f"/api/commands/{command}")["state"] == "done"
    assert not events_of(child_events, "command.failed")


def test_fork_from_a_checkpoint_and_from_an_event(world):
    source = world.spawn({"model": "demo", "checkpoint": True}, "write notes.txt: first version")
    world.wait_for(source, lambda evs: events_of(evs, "agent.checkpointed"), "the first checkpoint")
    world.send(source, "prompt", "write notes.txt: second version")
    events = world.wait_for(source, lambda evs: len(events_of(evs, "agent.checkpointed")) >= 2,
                            "the second checkpoint")
    first_cp = events_of(events, "agent.checkpointed")[0]["data"]["checkpoint"]
    first_finished = events_of(events, "turn.finished")[0]["seq"]

    r = world.post(f"/api/agents/{source}/fork", {"checkpoint": first_cp, "prompt": "run: cat notes.txt"})
    assert r.status_code == 201, r.text
    from_cp = r.json()["id"]
    child = world.wait_turns(from_cp, 1)
    assert "first version" in _bash_output(child, 2)  # turn numbering continues the source's
    forked = events_of(child, "agent.forked")[0]["data"]
    assert forked["rung"] == "restore" and forked["from"]["checkpoint"] == first_cp
    _assert_the_fork_command_is_done(world, r.json()["command"], child)

    r = world.post(f"/api/agents/{source}/fork", {"at_event": first_finished, "prompt": "run: cat notes.txt"})
    assert r.status_code == 201, r.text
    from_event = r.json()["id"]
    child = world.wait_turns(from_event, 1)
    forked = events_of(child, "agent.forked")[0]["data"]
    assert forked["rung"] == "rebuild" and forked["seeded_messages"] >= 2
    _assert_the_fork_command_is_done(world, r.json()["command"], child)
    result = next(e["data"] for e in events_of(child, "tool.result") if e["data"]["name"] == "bash")
    assert result["exit_code"] != 0  # a fresh disk: the file never existed there

    # The source is untouched: still its own disk and conversation.
    world.send(source, "prompt", "run: cat notes.txt")
    events = world.wait_turns(source, 3)
    assert "second version" in _bash_output(events, 3)
    assert not events_of(events, "agent.forked")
