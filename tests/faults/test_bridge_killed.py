"""The bridge process killed inside live sandboxes, at named moments and at random.

local: SIGKILL of the sandbox's recorded pid (the bridge is the sandbox's
command, so the sandbox is left exited) → rung `resume`.
docker: `docker exec <id> kill -9 <bridge pid>` (found through /proc; the
image has no ps). The bridge is docker-init's only child, so the container
exits with it → rung `restart` (or `resume` if it kept running).
One server, one agent per moment (tests/faults/placed.py: idle, mid-tool,
mid-model-call, a command journaled but not delivered, random), rounds of
kills in a seeded order: a turn that was running settles exactly once
(turn.interrupted by the restarted bridge), the held command is acted on once,
and every invariant holds.

Kills per run: local 2 rounds × 5 agents, docker 1 round × 5
(ALINEO_FAULT_REPEATS sets the rounds of both).
"""

from __future__ import annotations

import pytest

from tests.faults import invariants
from tests.faults.harness import (
    World, cleanup_sandboxes, kill_bridge, make_server, mid_turn_repeats)
from tests.faults.placed import MID_MODEL, MID_TOOL, MOMENTS, Subject, faulted_rounds

ROUNDS = {"local": 2, "docker": 1}


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_bridge_killed(kind, fault_row):
    fault_row.scenario = f"bridge killed ({kind})"
    server = make_server(kind)
    server.start()
    world = None
    try:
        world = World(server, kind, server.create_actor("bea"))
        subjects = [Subject(world.spawn({"model": "demo", "checkpoint": True},
                                        f"write first.txt: first-bridge-{m}"), m, True)
                    for m in MOMENTS]
        assert not invariants.settle(world, [s.agent for s in subjects], invariants.WAIT_SETTLE)
        rounds = mid_turn_repeats(ROUNDS[kind])
        allowed = {"resume"} if kind == "local" else {"resume", "restart"}
        rungs = faulted_rounds(world, subjects, lambda w, a: kill_bridge(w, a), fault_row,
                               label=f"bridge killed ({kind})", rounds=rounds,
                               expect=lambda s: allowed)
        print(f"[faults] bridge killed on {kind}: rungs {rungs}")
        for s in subjects:
            interrupted = [e["data"]["reason"] for e in world.events(s.agent)
                           if e["type"] == "turn.interrupted"]
            if s.moment in (MID_TOOL, MID_MODEL):
                assert interrupted == ["bridge_restarted"] * rounds, (s, interrupted)
            assert set(interrupted) <= {"bridge_restarted"}, (s, interrupted)
        assert not fault_row.violations, "\n".join(fault_row.violations)
    finally:
        if world is not None:
            world.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)
