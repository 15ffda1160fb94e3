"""`docker rm -f` of an agent's container, idle and mid-turn.

With turn checkpoints (`checkpoint: true`) the agent comes back on rung
`restore` (a fresh sandbox, the newest checkpoint in its home); without, on
rung `rebuild` (a fresh sandbox seeded with the conversation from the
transcript). The watcher notices without a prompt. A turn that was running
settles once as `turn.interrupted {reason: sandbox_lost}`; files written up to
the restored checkpoint are there. The local backend's analogue (the sandbox
removed: its process group killed, its directory deleted) runs too.
"""

from __future__ import annotations


import pytest

from tests.faults import invariants
from tests.faults.harness import (
    World,
    cleanup_sandboxes,
    fault_cases,
    make_server,
    mid_turn_repeats,
    remove_sandbox,
)

@pytest.mark.parametrize("kind", ["docker", "local"])
@pytest.mark.parametrize("checkpoint", [True, False], ids=["restore", "rebuild"])
def test_sandbox_removed(kind, checkpoint, fault_row):
    loss_scenario(kind, checkpoint, fault_row, make_server(kind))


def loss_scenario(kind: str, checkpoint: bool, fault_row, server, label: str = "") -> None:
    """The scenario on `server` (not started yet; SQLite or, from
    tests/scaleout/test_faults_pg.py, PostgreSQL + Redis)."""
    rung = "restore" if checkpoint else "rebuild"
    fault_row.scenario = f"sandbox removed → {rung} ({kind}{label})"
    server.start()
    world = None
    try:
        world = World(server, kind, server.create_actor("carl"))
        agent = world.spawn({"model": "demo", "checkpoint": checkpoint},
                            "write first.txt: first-loss\nspawn: say: a child that must stay")
        assert not invariants.settle(world, [agent], invariants.WAIT_SETTLE)
        repeats = mid_turn_repeats(1)
        rungs = fault_cases(world, agent, lambda w, a: remove_sandbox(w, a), fault_row,
                            label=f"{rung} rm -f", checkpoint=checkpoint, mid_turn_repeats=repeats)
        print(f"[faults] sandbox removed on {kind} ({rung}): rungs {rungs}")
        assert rungs == [rung] * (1 + repeats), rungs
        events = world.events(agent)
        interrupted = [e["data"] for e in events if e["type"] == "turn.interrupted"]
        assert [d["reason"] for d in interrupted] == ["sandbox_lost"] * repeats, interrupted
        assert not fault_row.violations, "\n".join(fault_row.violations)
    finally:
        if world is not None:
            world.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)
