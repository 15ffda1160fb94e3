"""`kill -9` of the control plane at random points during turns.

A real server drives three agents (one with turn checkpoints, a child spawned
by a `spawn:` directive, and more children now and then) through demo turns
with `sleep:` steps, steers and spawns. Each iteration sends commands —
some still in flight on another thread — waits a random moment, SIGKILLs the
server, starts it again on the same data dir (commands in flight are retried
with the same Idempotency-Key, as a client would), and checks every invariant
(tests.faults.invariants) including the next prompt and the files.

The kills cycle through named moments placed by the test on the first
agent picked (tests/faults/placed.py): ``mid-tool`` (a `sleep:` call running),
``mid-model-call`` (the demo model's `think:` in flight at the control plane's
model gateway, which dies with it), ``command journaled, not delivered`` (a
prompt acknowledged and held by the worker through ALINEO_TEST_HOLD_DIR, the
hold lifted before the restart), and ``random`` (a seeded delay; the summary
counts where the test found the agents). A placed kill that missed its moment
is a violation.
Every prompt sent from a thread must come back acknowledged (an exception,
a refusal or a hang there fails the test, never only warns); the only rung a
kill -9 of the control plane may take is ``reattach``, journaled once per
restart at most, and no agent may end lost or unrecoverable.

Seeded and reproducible in what it does (the moments depend on the machine):
the seed comes from ALINEO_FAULT_SEED or is drawn, and is printed.
ALINEO_FAULT_ITERATIONS overrides the local count (default 12: each placed moment three times; docker 5).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest

from tests.faults import invariants
from tests.faults.harness import DEMO, World, cleanup_sandboxes, excerpt, make_server
from tests.faults.placed import HELD, MID_MODEL, MID_TOOL, RANDOM, SEED, found, place, verify

#: The moments the kills cycle through (a kill -9 leaves the bridges running,
#: so a placed tool or model call lasts only PLACED_S).
CYCLE = (MID_TOOL, MID_MODEL, HELD, RANDOM)
PLACED_S = 2
ITERATIONS = {"local": int(os.environ.get("ALINEO_FAULT_ITERATIONS") or 12),
              "docker": int(os.environ.get("ALINEO_FAULT_DOCKER_ITERATIONS") or 5)}
MAX_CHILDREN = 3


def _work(rng: random.Random, i: int, agent: str, may_spawn: bool) -> tuple[str, str]:
    """A prompt for iteration i: a file, a sleep step, an echo; sometimes a spawn."""
    token = f"c{i}-{agent[-6:]}-{rng.randrange(10**6)}"
    lines = [f"write k{i}-{agent[-6:]}.txt: {token}",
             f"sleep: {rng.choice(['0.2', '0.4', '0.8', '1.2'])}",
             f"run: echo {token}"]
    if may_spawn:
        lines.append(f"spawn: say: child of iteration {i}")
    rng.shuffle(lines)
    return "\n".join(lines), token


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_kill_minus_nine_during_turns(kind, fault_row):
    kill_scenario(kind, fault_row, make_server(kind), ITERATIONS[kind])


def kill_scenario(kind: str, fault_row, server, n: int, label: str = "kill -9 control plane") -> None:
    """The scenario on `server` (not started yet; SQLite or, from
    tests/scaleout/test_faults_pg.py, PostgreSQL + Redis), `n` kills."""
    rng = random.Random(f"{SEED}:{kind}")
    fault_row.seed, fault_row.scenario = SEED, f"{label} ({kind})"
    print(f"\n[faults] kill -9 of the control plane on {kind}: seed {SEED} "
          f"(ALINEO_FAULT_SEED={SEED} reproduces it), {n} iterations")
    server.start()
    try:
        world = World(server, kind, server.create_actor("kim"))
        parent = world.spawn({"model": "demo", "checkpoint": True},
                             "write base.txt: base-of-parent\nspawn: say: first child")
        other = world.spawn(DEMO, "write base.txt: base-of-other")
        assert not invariants.settle(world, [parent, other], invariants.WAIT_SETTLE)
        child = world.wait_for(parent, lambda evs: any(e["type"] == "agent.child_spawned"
                                                       for e in evs),
                               "the first child")
        child = next(e["data"]["child"] for e in child if e["type"] == "agent.child_spawned")
        targets = [parent, other, child]
        spawned = 1
        for i in range(1, n + 1):
            picked = rng.sample(targets, rng.randint(1, len(targets)))
            threads, outcomes = [], []
            for agent in picked:
                may_spawn = agent == parent and spawned < MAX_CHILDREN and rng.random() < 0.15
                spawned += may_spawn
                text, _ = _work(rng, i, agent, may_spawn)
                if rng.random() < 0.3:
                    # In flight when the kill comes: the client retries with its key.
                    t = threading.Thread(target=_send_later, args=(
                        world, agent, text, rng.uniform(0, 0.6), outcomes))
                    t.start()
                    threads.append(t)
                else:
                    world.send(agent, "prompt", text)
                if rng.random() < 0.2:
                    world.send(agent, "steer", f"say: steer {i} for {agent[-6:]}")
            moment, delay = CYCLE[(i - 1) % len(CYCLE)], rng.uniform(0.0, 1.6)
            if moment == RANDOM:
                time.sleep(delay)  # the random moment itself, not a wait for a state
                now = sorted({f for a in picked for f in found(world, a)})
                where, missed = f"random → {'+'.join(now)}", None
            else:
                placed = place(world, picked[0], moment, f"k{i}-{picked[0][-6:]}", hold_s=PLACED_S)
                where, missed = verify(world, placed)
            server.kill()
            fault_row.placements[where] += 1
            if moment == HELD:
                placed.release(world)
            server.start()
            for t in threads:
                t.join(120)
            violations = [f"a prompt sent from a thread never came back: {t.name}"
                          for t in threads if t.is_alive()]
            violations += [f"a prompt sent from a thread failed: {o}" for o in outcomes
                           if o != "acknowledged"]
            violations += [missed] if missed else []
            violations += invariants.check(world)
            fault_row.iterations = i
            print(f"[faults] {kind} iteration {i}/{n}: killed at {where}, "
                  f"{len(violations)} violation(s)", flush=True)
            if violations:
                fault_row.violations += [f"seed {SEED} iteration {i}: {v}" for v in violations]
                print(f"[faults] iteration {i}: {len(violations)} violation(s):")
                for v in violations:
                    print("   ", v)
                for agent in {v.split(":")[0] for v in violations if v.startswith("ag_")}:
                    print(excerpt(world, agent))
        fault_row.violations += _rung_violations(world, targets, n)
        fault_row.add_rungs(Counter(world.rungs_of([a["id"] for a in world.agents()])))
        print(f"[faults] rungs taken: {dict(fault_row.rungs)}; kills landed: "
              f"{dict(fault_row.placements)}")
        assert not fault_row.violations, (
            f"seed {SEED}: {len(fault_row.violations)} invariant violation(s):\n"
            + "\n".join(fault_row.violations[:30]))
    finally:
        world_close = locals().get("world")
        if world_close is not None:
            world_close.close()
        server.stop()
        cleanup_sandboxes(server, kind)
        server.__exit__(None, None, None)


def _send_later(world: World, agent: str, text: str, delay: float, outcomes: list) -> None:
    """Send a prompt after `delay`; its outcome goes to `outcomes` (an
    exception in a thread would otherwise only be a pytest warning)."""
    try:
        time.sleep(delay)
        world.send(agent, "prompt", text, timeout=120)
        outcomes.append("acknowledged")
    except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost
        outcomes.append(f"{agent}: {type(exc).__name__}: {str(exc)[:300]}")


def _rung_violations(world: World, targets: list[str], kills: int) -> list[str]:
    """A kill -9 of the control plane leaves every sandbox running: the only
    rung is reattach (reason control_plane_restart), at most once per restart
    for each agent, at least once for those that lived through every kill;
    nobody ends lost or unrecoverable."""
    out = []
    for a in world.agents():
        events = world.events(a["id"])
        rungs = [(e["data"].get("rung"), e["data"].get("reason")) for e in events
                 if e["type"] == "agent.restored"]
        wrong = [r for r in rungs if r != ("reattach", "control_plane_restart")]
        if wrong:
            out.append(f"{a['id']}: a kill -9 of the control plane took rungs {wrong}")
        if len(rungs) > kills:
            out.append(f"{a['id']}: {len(rungs)} reattach facts for {kills} restarts")
        if a["id"] in targets and not rungs:
            out.append(f"{a['id']}: never reattached in {kills} restarts")
        if a["status"] in ("lost", "unrecoverable") or any(e["type"] == "agent.lost"
                                                          for e in events):
            out.append(f"{a['id']}: ended {a['status']!r} after a kill -9 of the control plane")
    return out
