"""The fault scenarios for `"harness": "pi"` (the real Pi from npm, the demo
model at the gateway), on both backends: kill -9 of the control plane at
seeded random moments during Pi's turns, the bridge killed inside the sandbox
(Pi ends with it and is started again on its session file) and the sandbox
removed (restored from the turn checkpoint, Pi's session file with it),
idle and mid-turn. Every invariant of tests/faults/invariants.py holds, and
Pi's conversation continues: the gateway's journal (`model.call`) shows the
last call carrying more than the first one did.

ALINEO_FAULT_SEED reproduces a run; ALINEO_FAULT_PI_ITERATIONS sets the
number of kills per backend (default 4: the make test budget; raise it for a
longer soak)."""

from __future__ import annotations

import contextlib
import os
import random
import time

import pytest

from sandboxes.harnesses import ensure_pi
from tests.faults import invariants
from tests.faults.harness import (
    World, cleanup_sandboxes, excerpt, fault_cases, kill_bridge, make_server, remove_sandbox)

SEED = int(os.environ.get("ALINEO_FAULT_SEED") or random.SystemRandom().randrange(1, 2**31))
ITERATIONS = int(os.environ.get("ALINEO_FAULT_PI_ITERATIONS") or 4)
PI = {"harness": "pi", "model": "demo"}


@pytest.fixture(scope="module", autouse=True)
def pi_installed():
    return ensure_pi()


def conversation_carried(world: World, agent: str) -> str | None:
    """Why the agent's last model call does not carry more than its first, or None."""
    calls = [e["data"]["usage"]["input_tokens"] for e in world.events(agent)
             if e["type"] == "model.call"]
    if len(calls) < 2 or calls[-1] <= calls[0]:
        return f"{agent}: the conversation did not continue (input tokens per call {calls})"
    return None


@contextlib.contextmanager
def served(kind: str, actor: str):
    """A live server on `kind` and a World for `actor`; everything removed after."""
    server = make_server(kind)
    server.start()
    world = None
    try:
        world = World(server, kind, server.create_actor(actor))
        yield world
    finally:
        if world is not None:
            world.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)


def _work(rng: random.Random, i: int, agent: str) -> str:
    token = f"p{i}-{agent[-6:]}-{rng.randrange(10**6)}"
    lines = [f"write k{i}-{agent[-6:]}.txt: {token}",
             f"sleep: {rng.choice(['0.2', '0.4', '0.8', '1.2'])}", f"run: echo {token}"]
    rng.shuffle(lines)
    return "\n".join(lines)


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_pi_kill_minus_nine_of_the_control_plane(kind, fault_row):
    rng = random.Random(f"{SEED}:pi:{kind}")
    fault_row.seed, fault_row.scenario = SEED, f"kill -9 control plane, pi ({kind})"
    print(f"\n[faults] pi: kill -9 of the control plane on {kind}: seed {SEED}, {ITERATIONS} kills")
    with served(kind, "pia") as world:
        server = world.server
        agents = [world.spawn({**PI, "checkpoint": True}, "write base.txt: base-of-first"),
                  world.spawn(PI, "write base.txt: base-of-second")]
        assert not invariants.settle(world, agents, invariants.WAIT_SETTLE)
        for i in range(1, ITERATIONS + 1):
            for agent in rng.sample(agents, rng.randint(1, len(agents))):
                world.send(agent, "prompt", _work(rng, i, agent))
                if rng.random() < 0.2:
                    world.send(agent, "steer", f"say: steer {i}")
            delay = rng.uniform(0.0, 1.6)
            time.sleep(delay)
            server.kill()
            server.start()
            violations = invariants.check(world)
            fault_row.iterations = i
            print(f"[faults] pi {kind} kill {i}/{ITERATIONS} after {delay:.2f} s: "
                  f"{len(violations)} violation(s)", flush=True)
            if violations:
                fault_row.violations += [f"seed {SEED} iteration {i}: {v}" for v in violations]
                for agent in agents:
                    print(excerpt(world, agent))
        fault_row.violations += [v for v in map(lambda a: conversation_carried(world, a), agents) if v]
        assert not fault_row.violations, "\n".join(fault_row.violations[:30])


@pytest.mark.parametrize("kind", ["local", "docker"])
@pytest.mark.parametrize("fault", ["bridge_killed", "sandbox_removed"])
def test_pi_sandbox_faults(kind, fault, fault_row):
    fault_row.scenario = f"{fault}, pi ({kind})"
    with served(kind, "pib") as world:
        agent = world.spawn({**PI, "checkpoint": True}, "write first.txt: first-pi")
        assert not invariants.settle(world, [agent], invariants.WAIT_SETTLE)
        act = kill_bridge if fault == "bridge_killed" else remove_sandbox
        rungs = fault_cases(world, agent, lambda w, a: act(w, a), fault_row,
                            label=f"pi {fault}", checkpoint=True)
        print(f"[faults] pi {fault} on {kind}: rungs {rungs}")
        allowed = {"restore"} if fault == "sandbox_removed" else {"resume", "restart"}
        assert set(rungs) <= allowed, f"rungs {rungs}, expected only {allowed}"
        carried = conversation_carried(world, agent)
        assert carried is None, carried
        assert not fault_row.violations, "\n".join(fault_row.violations)
