"""A machine reboot, on a SEPARATE dockerd — never the developer's.

The second engine has its own --data-root, --exec-root, --pidfile, unix socket
and --cgroup-parent, `--bridge=none --iptables=false` (docs: notes
docker-offline.md §5). The base image comes from the main engine (`docker
save | docker -H <second> load`). The server runs with DOCKER_HOST pointing at
it, with an agent at each moment (tests/faults/placed.py: idle with turn
checkpoints, mid-tool, a command journaled but not delivered, and — built-in
harness — mid-model-call), rebooted three times (Pi's row once).

"Reboot" = SIGKILL of the server, that dockerd (its pidfile), its containerd
(its ppid), its shims (their `-address` is under this exec-root) and the
container processes (this engine's cgroup parent) — only those; then, as a
reboot would, its mounts are unmounted, the exec-root wiped and the stale
pidfile removed; dockerd is started again: the containers are Exited. The
server, started again, brings the agents back on rung `restart` with /root
intact (the files written before, turn checkpoints or not), each running turn
settled once, the held command acted on once, and every invariant holds — for
the built-in harness and for `"harness": "pi"` (Pi started again on its session file in the intact /root).
Everything is removed at the end: the containers, the second dockerd (stopped
by PID), its processes, mounts and directories.
"""

from __future__ import annotations

import pytest

from tests.dockerd2 import SecondDockerd
from tests.faults import invariants
from tests.faults.harness import (
    World, cleanup_sandboxes, ensure_docker, ensure_root, excerpt,
    make_server, mid_turn_repeats, restored_count,
)
from tests.faults.placed import HELD, IDLE, MID_MODEL, MID_TOOL, SEED, place, verify

#: Reboots per run (ALINEO_FAULT_REPEATS for a longer soak). Pi's starts are
#: slow (node), so its row reboots once; the built-in harness three times.
REBOOTS = {"builtin": 3, "pi": 1}


@pytest.mark.parametrize("harness", ["builtin", "pi"])
def test_machine_reboot(harness, fault_row):
    fault_row.scenario = "machine reboot (second dockerd)" + (", pi" if harness == "pi" else "")
    fault_row.seed = SEED
    ensure_root()
    ensure_docker()
    from sandboxes import harnesses, images

    install = harnesses.ensure_harness({"harness": harness})  # once, before anything is timed

    tag, _ = images.ensure_base_image()
    engine = SecondDockerd()
    server = None
    world = None
    try:
        engine.start()
        engine.load_image(tag)
        if install is not None:  # the harness layer, made once on the main engine, copied over
            from sandboxes.backends.docker import DockerBackend
            from sandboxes.setup import ensure_harness_layer

            engine.load_image(ensure_harness_layer(DockerBackend(), tag, install,
                                                   harnesses.HARNESS_DIR))
        server = make_server("docker", env={"DOCKER_HOST": engine.host})
        server.start()
        world = World(server, "docker", server.create_actor("rita"))
        demo = {"model": "demo", "harness": harness}
        # One agent per moment the reboot finds it at (the model call in flight
        # is the gateway's `think:`, the built-in harness's; Pi's row skips it).
        moments = [IDLE, MID_TOOL, HELD] + ([MID_MODEL] if harness == "builtin" else [])
        agents = {m: world.spawn({**demo, "checkpoint": m == IDLE}, f"write before.txt: {m}")
                  for m in moments}
        assert not invariants.settle(world, list(agents.values()), invariants.WAIT_SETTLE)
        sids = {a: world.agent(a)["sandbox_id"] for a in agents.values()}
        reboots = mid_turn_repeats(REBOOTS[harness])
        for r in range(1, reboots + 1):
            reboot_once(world, server, engine, agents, sids, fault_row, r)
        for m in (MID_TOOL, MID_MODEL):
            if m in agents:
                interrupted = [e["data"] for e in world.events(agents[m])
                               if e["type"] == "turn.interrupted"]
                assert len(interrupted) == reboots, (m, interrupted)
        assert set(fault_row.rungs) == {"restart"}, fault_row.rungs
        assert not fault_row.violations, "\n".join(fault_row.violations)
    finally:
        if world is not None:
            world.close()
        if server is not None:
            server.stop()
            cleanup_sandboxes(server, "docker", docker_host=engine.host)
        engine.stop()
        if server is not None:
            server.__exit__(None, None, None)


def reboot_once(world, server, engine, agents: dict, sids: dict, row, r: int) -> None:
    """One reboot with every agent placed at its moment; the ladder restarts
    each in the same container with /root intact; every invariant holds."""
    placed = [place(world, a, m, f"b{r}-{m[:4]}", hold_s=30, queue_behind=True)
              for m, a in agents.items()]
    checked = [verify(world, p) for p in placed]
    row.violations += [f"reboot {r}: {why}" for _, why in checked if why]
    row.placements.update(where for where, _ in checked)
    before = {a: restored_count(world.events(a)) for a in agents.values()}

    server.kill()
    killed = engine.reboot()
    print(f"[faults] reboot {r}: SIGKILLed {({k: len(v) for k, v in killed.items()})}")
    assert killed["dockerd"] and killed["shim"] and killed["container"], killed
    engine.start()
    states = {a: engine.docker("inspect", "-f", "{{.State.Status}}", sid).stdout.decode().strip()
              for a, sid in sids.items()}
    assert set(states.values()) == {"exited"}, states
    for p in placed:
        p.release(world)
    server.start()

    rungs = []
    for agent in agents.values():
        events = world.wait_for(agent, lambda evs, a=agent: restored_count(evs) > before[a],
                                "the ladder after the reboot")
        new = [e for e in events if e["type"] in ("agent.restored", "agent.lost")][before[agent]:]
        rungs += [e["data"].get("rung", "lost") for e in new]
    row.add_rungs(rungs)
    violations = invariants.check(world)
    row.iterations += len(agents)
    row.violations += [f"reboot {r}: {v}" for v in violations]
    print(f"[faults] reboot {r}: kills at {[w for w, _ in checked]}, rungs {rungs}, "
          f"{len(violations)} violation(s)", flush=True)
    if violations:
        print("\n".join(violations))
        for agent in agents.values():
            print(excerpt(world, agent, width=30))
    assert rungs == ["restart"] * len(agents), rungs
    for agent in agents.values():
        assert world.agent(agent)["sandbox_id"] == sids[agent], "the same container, started again"
