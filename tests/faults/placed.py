"""Kills placed by the test at named moments, and rounds of them.

A moment is where a fault finds an agent, made to hold until the fault lands:

- ``idle``: settled, nothing pending;
- ``mid-tool``: a `sleep:` tool call running (dispatched, no result);
- ``mid-model-call``: the demo model's `think:` — the model call itself in
  flight (the turn started, no assistant message, no tool call yet);
- ``command journaled, not delivered``: a prompt acknowledged (its Command row
  committed) that the worker holds undelivered while the test's hold file is
  there (settings.ALINEO_TEST_HOLD_DIR, which only tests set);
- ``random``: a short prompt, then the fault after a seeded random delay,
  wherever it lands (counted as ``random → <what the test found>``).

`place` puts one agent there and `verify` checks, just before the fault, that
it is there (a placed kill that missed is a violation, never a silent
"random"). `faulted_rounds` runs rounds on one server: every agent of the round
placed at its moment, then each faulted in a seeded order, then the ladder
awaited for all and every invariant checked — many kills for one control
plane start. Seeded: ALINEO_FAULT_SEED, else drawn and printed.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.faults import invariants
from tests.faults.harness import WAIT, Ack, Row, World, excerpt, restored_count, wait_running_step

SEED = int(os.environ.get("ALINEO_FAULT_SEED") or random.SystemRandom().randrange(1, 2**31))

IDLE, MID_TOOL, MID_MODEL, HELD, RANDOM = (
    "idle", "mid-tool", "mid-model-call", "command journaled, not delivered", "random")
MOMENTS = (IDLE, MID_TOOL, MID_MODEL, HELD, RANDOM)
FORCED = (MID_TOOL, MID_MODEL, HELD)


def hold_dir(world: World) -> Path:
    """The server's ALINEO_TEST_HOLD_DIR (tests.faults.harness.make_server sets it)."""
    return Path(world.server.extra_env["ALINEO_TEST_HOLD_DIR"])


@dataclass
class Placed:
    agent: str
    moment: str
    tag: str
    ack: Ack | None = None

    def release(self, world: World) -> None:
        """After the fault: let the worker deliver what it held."""
        if self.moment == HELD:
            (hold_dir(world) / self.agent).unlink(missing_ok=True)


def place(world: World, agent: str, moment: str, tag: str, *, hold_s: float,
          rng: random.Random | None = None, queue_behind: bool = False) -> Placed:
    """Put `agent` (settled) at `moment` and wait until it is there. `hold_s`:
    how long a placed tool call or model call lasts (long where the fault ends
    it; short where the sandbox survives, as under a kill -9 of the control
    plane). `tag` makes this placement's files and markers unique.
    `queue_behind`: mid-tool, a second prompt is handed to the bridge, queued
    behind the running turn (its Command row done), before the fault."""
    placed = Placed(agent, moment, tag)
    if moment == MID_TOOL:
        marker = f"{hold_s:.0f}.{zlib.crc32(tag.encode()) % 10**6:06d}"  # unique: found by it
        placed.ack = world.send(agent, "prompt", f"write {tag}.txt: {tag}\nsleep: {marker}\n"
                                                 f"run: echo after-{tag}")
        wait_running_step(world, agent, f"sleep {marker}")
        if queue_behind:
            world.send(agent, "prompt", f"write q-{tag}.txt: queued-{tag}")
            deadline = time.monotonic() + WAIT
            while world.pending_commands(agent):
                assert time.monotonic() < deadline, f"{agent}: the queued prompt never left"
                time.sleep(0.1)
    elif moment == MID_MODEL:
        placed.ack = world.send(agent, "prompt", f"think: {hold_s:.0f}\nwrite {tag}.txt: {tag}")
        world.wait_for(agent, lambda evs: in_model_call(evs, placed.ack.command),
                       f"the model call of command {placed.ack.command} in flight")
    elif moment == HELD:
        hold = hold_dir(world)
        hold.mkdir(exist_ok=True)
        (hold / agent).touch()
        placed.ack = world.send(agent, "prompt", f"write {tag}.txt: {tag}")
    elif moment == RANDOM:
        rng = rng or random.Random(tag)
        placed.ack = world.send(agent, "prompt", f"write {tag}.txt: {tag}\n"
                                f"sleep: {rng.choice(['0.2', '0.5', '0.9'])}\nrun: echo {tag}")
    return placed


def in_model_call(events: list[dict], command: int) -> bool:
    """The turn of `command` started and has no assistant message, tool call or end yet."""
    turn = next((e["data"].get("turn") for e in events if e["type"] == "turn.started"
                 and str(e["data"].get("command_id")) == str(command)), None)
    if turn is None:
        return False
    return not any(e["data"].get("turn") == turn and e["type"] in (
        "message.assistant", "tool.dispatched", *invariants.SETTLE) for e in events)


def found(world: World, agent: str) -> list[str]:
    """Where the test finds `agent` now (just before a fault)."""
    events = world.events(agent)
    out = set()
    calls = {e["data"].get("tool_call_id") for e in events if e["type"] == "tool.dispatched"}
    calls -= {e["data"].get("tool_call_id") for e in events if e["type"] == "tool.result"}
    if calls:
        out.add(MID_TOOL)
    elif invariants.unsettled_turns(events):
        out.add(MID_MODEL)
    if world.pending_commands(agent):
        out.add(HELD)
    return sorted(out) or [IDLE]


def verify(world: World, placed: Placed) -> tuple[str, str | None]:
    """(the placement's label for the summary table, why it missed or None)."""
    now = found(world, placed.agent)
    if placed.moment == RANDOM:
        return f"random → {'+'.join(now)}", None
    if placed.moment == MID_MODEL:
        ok = in_model_call(world.events(placed.agent), placed.ack.command)
    elif placed.moment == HELD:
        ok = placed.ack.command in world.pending_commands(placed.agent)
    else:
        ok = placed.moment in now
    return placed.moment, None if ok else (f"{placed.agent}: placed {placed.moment!r} but "
                                          f"found {now} when the fault came")


def wait_checkpointed(world: World, agents: list[str], timeout: float = 30.0) -> None:
    """Until each agent's finished turns have their checkpoints (not an
    assertion: the invariants judge whatever checkpoints were taken)."""
    deadline = time.monotonic() + timeout
    for agent in agents:
        while time.monotonic() < deadline:
            events = world.events(agent)
            if (sum(e["type"] == "agent.checkpointed" for e in events)
                    >= sum(e["type"] == "turn.finished" for e in events)):
                break
            time.sleep(0.2)


@dataclass(frozen=True)
class Subject:
    agent: str
    moment: str
    checkpoint: bool


def faulted_rounds(world: World, subjects: list[Subject], fault: Callable[[World, str], object],
                   row: Row, *, label: str, rounds: int, hold_s: float = 60.0,
                   expect: Callable[[Subject], set[str]]) -> list[str]:
    """`rounds` rounds: each subject placed at its moment (the random one last,
    then a seeded delay), each faulted in a seeded order, the holds released,
    a new agent.restored (or agent.lost) awaited for each, every invariant
    checked. `expect(subject)` is the set of rungs it may take. Returns the
    rungs; placements, kills, rungs and violations go to `row`."""
    rng = random.Random(f"{SEED}:{label}")
    row.seed = SEED
    taken: list[str] = []
    checkpointed = [s.agent for s in subjects if s.checkpoint]
    for r in range(1, rounds + 1):
        wait_checkpointed(world, checkpointed)
        before = {s.agent: restored_count(world.events(s.agent)) for s in subjects}
        order = sorted(subjects, key=lambda s: s.moment == RANDOM)  # the random one last
        placed = [place(world, s.agent, s.moment, f"r{r}-{s.agent[-6:]}", hold_s=hold_s, rng=rng,
                        queue_behind=True) for s in order]
        if any(s.moment == RANDOM for s in subjects):
            time.sleep(rng.uniform(0.0, 1.5))  # the random moment itself, not a wait for a state
        checked = [verify(world, p) for p in placed]
        row.violations += [f"{label} round {r}: {why}" for _, why in checked if why]
        row.placements.update(where for where, _ in checked)
        for p in rng.sample(placed, len(placed)):
            fault(world, p.agent)
        for p in placed:
            p.release(world)
        rungs = _await_ladder(world, subjects, before, label, row)
        taken += rungs
        violations = invariants.check(world)
        row.iterations += len(subjects)
        wrong = [f"{s.agent} ({s.moment}) took {got}, expected one of {sorted(expect(s))}"
                 for s, got in zip(subjects, rungs) if got not in expect(s)]
        row.violations += [f"{label} round {r}: {v}" for v in violations + wrong]
        print(f"[faults] {label} round {r}/{rounds}: {len(subjects)} kills at "
              f"{[w for w, _ in checked]}, rungs {rungs}, {len(violations) + len(wrong)} "
              f"violation(s)", flush=True)
        for v in violations + wrong:
            print("   ", v)
            if v.startswith("ag_"):
                print(excerpt(world, v.split(":")[0].split(" ")[0], width=14))
    row.add_rungs(Counter(taken))
    return taken


def _await_ladder(world: World, subjects: list[Subject], before: dict, label: str,
                  row: Row) -> list[str]:
    rungs = []
    for s in subjects:
        events = world.wait_for(s.agent, lambda evs, a=s.agent: restored_count(evs) > before[a],
                                f"the ladder after {label} ({s.moment})", timeout=WAIT)
        new = [e for e in events if e["type"] in ("agent.restored", "agent.lost")][before[s.agent]:]
        rungs.append(new[0]["data"].get("rung", "lost"))
        if len(new) > 1:
            row.violations.append(f"{label}: {s.agent} took {len(new)} rungs for one fault: "
                                  f"{[e['data'].get('rung') for e in new]}")
    return rungs
