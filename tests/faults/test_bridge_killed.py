"""The bridge process killed inside a live sandbox.

local: SIGKILL of the sandbox's recorded pid (the bridge is the sandbox's
command, so the sandbox is left exited) → rung `resume`.
docker: `docker exec <id> kill -9 <bridge pid>` (found through /proc; the
image has no ps). The bridge is docker-init's only child, so the container
exits with it → rung `restart` (or `resume` if it kept running).
Idle and mid-turn (a `sleep:` step running): the turn settles exactly once
(turn.interrupted by the restarted bridge), and every invariant holds.
"""

from __future__ import annotations

import pytest

from tests.faults.harness import (
    World,
    cleanup_sandboxes,
    fault_cases,
    kill_bridge,
    make_server,
    mid_turn_repeats,
)
from tests.faults import invariants


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_bridge_killed(kind, fault_row):
    fault_row.scenario = f"bridge killed ({kind})"
    server = make_server(kind)
    server.start()
    world = None
    try:
        world = World(server, kind, server.create_actor("bea"))
        agent = world.spawn({"model": "demo", "checkpoint": True}, "write first.txt: first-bridge")
        assert not invariants.settle(world, [agent], invariants.WAIT_SETTLE)
        repeats = mid_turn_repeats(2)
        rungs = fault_cases(world, agent, lambda w, a: kill_bridge(w, a), fault_row,
                            label="bridge killed", checkpoint=True, mid_turn_repeats=repeats)
        print(f"[faults] bridge killed on {kind}: rungs {rungs}")
        allowed = {"resume"} if kind == "local" else {"resume", "restart"}
        assert set(rungs) <= allowed, f"rungs {rungs}, expected only {allowed}"
        events = world.events(agent)
        interrupted = [e["data"] for e in events if e["type"] == "turn.interrupted"]
        assert len(interrupted) == repeats and all(d["reason"] == "bridge_restarted" for d in interrupted), \
            interrupted
        assert not fault_row.violations, "\n".join(fault_row.violations)
    finally:
        if world is not None:
            world.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)
