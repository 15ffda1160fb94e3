"""A zero-data-retention workspace: its agents run, but no checkpoint file or
row is ever written, the listing is empty and there is nothing to fork from;
when its sandbox is lost, the agent is rebuilt from the transcript (its
conversation, not its disk) and says why."""

from __future__ import annotations

from tests.integration.worlds import assert_sound, events_of, remove_sandbox


def test_zero_retention_writes_no_checkpoint(world):
    world.server.django(
        "from sessions.models import Workspace\n"
        f"Workspace.objects.filter(name={world.actor.workspace!r}).update(zero_data_retention=True)\n"
        "result = 1\n")
    try:
        agent = world.spawn({"model": "demo", "checkpoint": True}, "write notes.txt: private")
        events = world.wait_turns(agent, 1)
        world.send(agent, "prompt", "say: again")
        events = world.wait_turns(agent, 2)
        assert not events_of(events, "agent.checkpointed") and not events_of(events, "agent.checkpoint_failed")
        folder = world.server.data_dir / "checkpoints" / agent
        assert not folder.exists() or not any(folder.iterdir())
        rows = world.server.django(
            f"from sessions.models import Checkpoint\nresult = Checkpoint.objects.filter(agent_id={agent!r}).count()\n")
        assert rows == 0
        assert world.get(f"/api/agents/{agent}/checkpoints")["checkpoints"] == []
        r = world.post(f"/api/agents/{agent}/fork", {"checkpoint": 1})
        assert r.status_code in (404, 409)

        # The sandbox is lost: nothing to restore, so rung rebuild, with the reason.
        old = world.get(f"/api/agents/{agent}")["sandbox_id"]
        remove_sandbox(world, old)
        world.send(agent, "prompt", "run: cat notes.txt || echo no-notes-here")
        events = world.wait_turns(agent, 3)
        rungs = [e["data"] for e in events_of(events, "agent.restored")]
        assert [(r["rung"], r["reason"]) for r in rungs] == [("rebuild", "zero_data_retention")]
        assert rungs[0]["old_sandbox_id"] == old != world.get(f"/api/agents/{agent}")["sandbox_id"]
        seeded = events_of(events, "session.seeded")
        assert seeded and seeded[-1]["data"]["turns"] == 2  # the conversation came back
        assert "no-notes-here" in events_of(events, "tool.result")[-1]["data"]["output"]  # the disk did not
        assert not events_of(events, "agent.checkpointed")
        assert_sound(events)
    finally:
        world.server.django(
            "from sessions.models import Workspace\n"
            f"Workspace.objects.filter(name={world.actor.workspace!r}).update(zero_data_retention=False)\n"
            "result = 1\n")
