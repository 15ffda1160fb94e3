"""Wait-for inputs (`DATA_DIR/inputs/<agent>/*.txt` and `inputs.json`) are
written again into the fresh sandbox the restore ladder builds: docker at
`/inputs/*.txt` and `/inputs.json`, local under `$ALINEO_RUN_DIR/inputs/`."""

from __future__ import annotations

from tests.integration.worlds import events_of, remove_sandbox


def test_inputs_are_written_again_into_a_restored_sandbox(world):
    agent = world.spawn({"model": "demo", "checkpoint": True}, "say: ready")
    world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    inputs = world.server.data_dir / "inputs" / agent
    inputs.mkdir(parents=True)
    (inputs / "task.txt").write_text("the task input")
    (inputs / "inputs.json").write_text('{"ticket": 42}')
    remove_sandbox(world, world.get(f"/api/agents/{agent}")["sandbox_id"])
    if world.kind == "docker":
        command = "run: cat /inputs/task.txt /inputs.json"
    else:
        command = "run: cat $ALINEO_RUN_DIR/inputs/task.txt $ALINEO_RUN_DIR/inputs/inputs.json"
    world.send(agent, "prompt", command)
    events = world.wait_turns(agent, 2)
    assert events_of(events, "agent.restored")[-1]["data"]["rung"] == "restore"
    result = next(e["data"] for e in events_of(events, "tool.result") if e["data"].get("turn") == 2)
    assert result["exit_code"] == 0, result
    assert "the task input" in result["output"] and '"ticket": 42' in result["output"]
