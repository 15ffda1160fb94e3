"""A zero-data-retention workspace: its agents run, but no checkpoint file or
row is ever written, the listing is empty and there is nothing to fork from."""

from __future__ import annotations

from tests.integration.worlds import events_of


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
    finally:
        world.server.django(
            "from sessions.models import Workspace\n"
            f"Workspace.objects.filter(name={world.actor.workspace!r}).update(zero_data_retention=False)\n"
            "result = 1\n")
