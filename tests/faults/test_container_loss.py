"""`docker rm -f` of agents' containers, at named moments and at random.

One server, a set of agents — each placed at its moment (tests/faults/placed.py:
idle, mid-tool, mid-model-call, a command journaled but not delivered, and a
random moment), half with turn checkpoints (`checkpoint: true`), half without —
and rounds of faults: every agent's sandbox removed in a seeded order, the
ladder awaited for each, every invariant checked. With checkpoints an agent
comes back on rung `restore` (a fresh sandbox, the newest checkpoint in its
home); without, on rung `rebuild` (a fresh sandbox seeded with the
conversation from the transcript). The watcher notices without a prompt. A
turn that was running settles once as `turn.interrupted {reason:
sandbox_lost}`; files written up to the restored checkpoint are there; the
held command is acted on once, after. The local backend's analogue (the
sandbox removed: its process group killed, its directory deleted) runs too.

Kills per run: local 1 round × 10 agents, docker 1 round × 5
(ALINEO_FAULT_REPEATS sets the rounds of both, for a longer soak).
"""

from __future__ import annotations

import pytest

from tests.faults import invariants
from tests.faults.harness import (
    World, cleanup_sandboxes, make_server, mid_turn_repeats, remove_sandbox)
from tests.faults.placed import MID_MODEL, MID_TOOL, MOMENTS, Subject, faulted_rounds

ROUNDS = {"local": 1, "docker": 1}


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_sandbox_removed(kind, fault_row):
    loss_scenario(kind, fault_row, make_server(kind), mid_turn_repeats(ROUNDS[kind]))


def loss_scenario(kind: str, fault_row, server, rounds: int, label: str = "") -> None:
    """The scenario on `server` (not started yet; SQLite or, from
    tests/scaleout/test_faults_pg.py, PostgreSQL + Redis). local: each moment
    with and without checkpoints (10 agents); docker: each moment once,
    checkpoints on every other one (5 agents)."""
    fault_row.scenario = f"sandbox removed → restore, rebuild ({kind}{label})"
    server.start()
    world = None
    try:
        world = World(server, kind, server.create_actor("carl"))
        kinds = [(m, c) for m in MOMENTS for c in (True, False)] if kind == "local" else \
            [(m, i % 2 == 0) for i, m in enumerate(MOMENTS)]
        # Every agent keeps its sandbox (no slot-making unload of an idle one).
        server.set_quotas(world.actor, max_sandboxes=len(kinds) + 1)
        subjects = [Subject(world.spawn({"model": "demo", "checkpoint": c},
                                        f"write first.txt: first-loss-{m}" +
                                        ("\nspawn: say: a child that must stay" if not i else "")),
                            m, c)
                    for i, (m, c) in enumerate(kinds)]
        agents = [s.agent for s in subjects]
        assert not invariants.settle(world, agents, invariants.WAIT_SETTLE)
        for a in agents:  # a second turn: two checkpoints, so the newest is not the only one
            world.send(a, "prompt", "write second.txt: second-loss")
        assert not invariants.settle(world, agents, invariants.WAIT_SETTLE)
        rungs = faulted_rounds(world, subjects, lambda w, a: remove_sandbox(w, a), fault_row,
                               label=f"rm -f ({kind})", rounds=rounds,
                               expect=lambda s: {"restore" if s.checkpoint else "rebuild"})
        print(f"[faults] sandbox removed on {kind}: rungs {rungs}")
        for s in subjects:
            reasons = [e["data"]["reason"] for e in world.events(s.agent)
                       if e["type"] == "turn.interrupted"]
            if s.moment in (MID_TOOL, MID_MODEL):  # every round's placed turn, cut once
                assert reasons == ["sandbox_lost"] * rounds, (s, reasons)
            assert set(reasons) <= {"sandbox_lost"}, (s, reasons)
        assert not fault_row.violations, "\n".join(fault_row.violations)
    finally:
        if world is not None:
            world.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)
