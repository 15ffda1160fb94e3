"""The fault scenarios for `"harness": "pi"` (the real Pi from npm, the demo
model at the gateway), on both backends: kill -9 of the control plane at
seeded random moments during Pi's turns, the bridge killed inside the sandbox
(Pi ends with it and is started again on its session file) and the sandbox
removed (restored from the turn checkpoint, Pi's session file with it),
idle and mid-turn. Every invariant of tests/faults/invariants.py holds, and
Pi's conversation continues, asserted from the gateway's journal
(`model.call` input tokens, which count everything a call carried): after
every fault the next call carries at least what the last finished turn's
calls did, and the last call more than the first.

The kills are cheap so that many fit the make test budget: one server per
backend serves every scenario of the module (its start, with migrations, is
most of a scenario's fixed cost), three Pi agents share it during the kills
(each kill lands on all of them), short steps, and
between kills only the transcript invariants (every turn settled once, every
acknowledged command acted on once, no fact twice); the full check (each
agent answers a prompt and has its files) every FULL_CHECK_EVERY kills and
after the last. ALINEO_FAULT_SEED reproduces a run; ALINEO_FAULT_PI_ITERATIONS
sets the number of kills per backend (default 6: `make test`'s budget; each lands on three Pi agents)."""

from __future__ import annotations

import contextlib
import os
import random
import time

import pytest

from sandboxes.harnesses import ensure_pi
from tests.faults import invariants, placed
from tests.faults.harness import (
    World, cleanup_sandboxes, excerpt, fault_cases, kill_bridge, make_server,
    remove_sandbox)

SEED = int(os.environ.get("ALINEO_FAULT_SEED") or random.SystemRandom().randrange(1, 2**31))
ITERATIONS = int(os.environ.get("ALINEO_FAULT_PI_ITERATIONS") or 6)
FULL_CHECK_EVERY = 3
PI = {"harness": "pi", "model": "demo"}


def landed(world: World, agents: list[str]) -> list[str]:
    """Where a kill about to land finds these agents (read just before it):
    each moment any of them is at, or idle when none is busy."""
    moments = {m for agent in agents for m in placed.found(world, agent)} - {placed.IDLE}
    return sorted(moments) or [placed.IDLE]


@pytest.fixture(scope="module", autouse=True)
def pi_installed():
    return ensure_pi()


def conversation_carried(world: World, agent: str) -> list[str]:
    """Why Pi's conversation did not continue, from the gateway's journal
    (empty: it did). A call's input tokens count all it carried (system,
    tools, every message), so a Pi that lost its conversation asks with far
    fewer: after each fault (an ``agent.restored`` fact, reattach included)
    the next call must carry at least the largest call of the last turn that
    finished before it (a turn checkpoint holds that turn), and the agent's
    last call more than its first."""
    events = world.events(agent)
    calls = [(e["seq"], e["data"].get("turn"), e["data"]["usage"]["input_tokens"])
             for e in events if e["type"] == "model.call"]
    out = []
    if len(calls) < 2 or calls[-1][2] <= calls[0][2]:
        out.append(f"{agent}: the conversation did not grow (input tokens per call "
                   f"{[c[2] for c in calls]})")
    for fault in (e["seq"] for e in events if e["type"] == "agent.restored"):
        finished = [e["data"]["turn"] for e in events
                    if e["type"] == "turn.finished" and e["seq"] < fault]
        before = [c[2] for c in calls if finished and c[1] == finished[-1] and c[0] < fault]
        after = next((c for c in calls if c[0] > fault), None)
        if before and after is not None and after[2] < max(before):
            out.append(f"{agent}: after the fault at seq {fault} the next model call (seq "
                       f"{after[0]}) carried {after[2]} input tokens, fewer than the {max(before)} "
                       f"of turn {finished[-1]}: Pi did not continue its conversation")
    return out


def pi_layer(install) -> str:
    """The base image with Pi as a layer, made before the first scenario
    needs it: made once per image (~60 s under load), it would otherwise
    land inside a scenario's settle wait."""
    from sandboxes import images
    from sandboxes.backends.docker import DockerBackend
    from sandboxes.harnesses import HARNESS_DIR
    from sandboxes.setup import ensure_harness_layer

    tag, _ = images.ensure_base_image()
    return ensure_harness_layer(DockerBackend(), tag, install, HARNESS_DIR)


@pytest.fixture(scope="module", params=["local", "docker"])
def pi_server(request, pi_installed):
    """One live server per backend for every scenario of this module (each
    with an actor of its own): a server's start (migrations, boot) is most of
    a scenario's fixed cost. Its sandboxes are removed after the last."""
    kind = request.param
    server = make_server(kind)
    server.kind = kind
    if kind == "docker":
        pi_layer(pi_installed)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)


@contextlib.contextmanager
def served(server, actor: str):
    """A World for a new `actor` on the module's server (running again if a
    scenario left it killed)."""
    if server.proc is None or server.proc.poll() is not None:
        server.start()
    world = World(server, server.kind, server.create_actor(actor))
    try:
        yield world
    finally:
        world.close()


def _work(rng: random.Random, i: int, agent: str) -> str:
    token = f"p{i}-{agent[-6:]}-{rng.randrange(10**6)}"
    lines = [f"write k{i}-{agent[-6:]}.txt: {token}",
             f"sleep: {rng.choice(['0.1', '0.3', '0.6'])}", f"run: echo {token}"]
    rng.shuffle(lines)
    return "\n".join(lines)


def test_pi_kill_minus_nine_of_the_control_plane(pi_server, fault_row):
    kind = pi_server.kind
    rng = random.Random(f"{SEED}:pi:{kind}")
    fault_row.seed, fault_row.scenario = SEED, f"kill -9 control plane, pi ({kind})"
    print(f"\n[faults] pi: kill -9 of the control plane on {kind}: seed {SEED}, {ITERATIONS} kills")
    with served(pi_server, "pia") as world:
        server = world.server
        agents = [world.spawn({**PI, "checkpoint": True}, "write base.txt: base-of-first"),
                  world.spawn(PI, "write base.txt: base-of-second"),
                  world.spawn({**PI, "checkpoint": True}, "write base.txt: base-of-third")]
        assert not invariants.settle(world, agents, invariants.WAIT_SETTLE)
        for i in range(1, ITERATIONS + 1):
            for agent in rng.sample(agents, rng.randint(1, len(agents))):
                world.send(agent, "prompt", _work(rng, i, agent))
                if rng.random() < 0.2:
                    world.send(agent, "steer", f"say: steer {i}")
            delay = rng.uniform(0.0, 1.2)
            time.sleep(delay)
            fault_row.placements.update(landed(world, agents))
            server.kill()
            booted = time.monotonic()
            server.start()
            checked = time.monotonic()
            full = i % FULL_CHECK_EVERY == 0 or i == ITERATIONS
            violations = invariants.check(world, agents, probe=full)
            fault_row.iterations = i
            print(f"[faults] pi {kind} kill {i}/{ITERATIONS} after {delay:.2f} s (boot "
                  f"{checked - booted:.1f} s, check {time.monotonic() - checked:.1f} s"
                  f"{', full' if full else ''}): {len(violations)} violation(s)", flush=True)
            if violations:
                fault_row.violations += [f"seed {SEED} iteration {i}: {v}" for v in violations]
                for agent in agents:
                    print(excerpt(world, agent))
        for agent in agents:
            fault_row.violations += conversation_carried(world, agent)
        assert not fault_row.violations, "\n".join(fault_row.violations[:30])


@pytest.mark.parametrize("fault", ["bridge_killed", "sandbox_removed"])
def test_pi_sandbox_faults(pi_server, fault, fault_row):
    kind = pi_server.kind
    fault_row.scenario = f"{fault}, pi ({kind})"
    with served(pi_server, f"pib-{fault.replace('_', '-')}") as world:
        agent = world.spawn({**PI, "checkpoint": True}, "write first.txt: first-pi")
        assert not invariants.settle(world, [agent], invariants.WAIT_SETTLE)
        act = kill_bridge if fault == "bridge_killed" else remove_sandbox
        rungs = fault_cases(world, agent, lambda w, a: act(w, a), fault_row,
                            label=f"pi {fault}", checkpoint=True)
        print(f"[faults] pi {fault} on {kind}: rungs {rungs}")
        allowed = {"restore"} if fault == "sandbox_removed" else {"resume", "restart"}
        assert set(rungs) <= allowed, f"rungs {rungs}, expected only {allowed}"
        fault_row.violations += conversation_carried(world, agent)
        assert not fault_row.violations, "\n".join(fault_row.violations)
