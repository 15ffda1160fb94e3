"""A machine reboot, on a SEPARATE dockerd — never the developer's.

The second engine has its own --data-root, --exec-root, --pidfile, unix socket
and --cgroup-parent, `--bridge=none --iptables=false` (docs: notes
docker-offline.md §5). The base image comes from the main engine (`docker
save | docker -H <second> load`). The server runs with DOCKER_HOST pointing at
it, with one idle agent and one mid-turn (a `sleep:` step running).

"Reboot" = SIGKILL of the server, that dockerd (its pidfile), its containerd
(its ppid), its shims (their `-address` is under this exec-root) and the
container processes (this engine's cgroup parent) — only those; then, as a
reboot would, its mounts are unmounted, the exec-root wiped and the stale
pidfile removed; dockerd is started again: the containers are Exited. The
server, started again, brings the agents back on rung `restart` with /root
intact (the files written before, turn checkpoints or not), the running turn
settled once, and every invariant holds — for the built-in harness and for
`"harness": "pi"` (Pi started again on its session file in the intact /root).
Everything is removed at the end: the containers, the second dockerd (stopped
by PID), its processes, mounts and directories.
"""

from __future__ import annotations

import pytest

from tests.dockerd2 import SecondDockerd
from tests.faults import invariants
from tests.faults.harness import (
    World, cleanup_sandboxes, ensure_docker, ensure_root, excerpt,
    make_server, restored_count, wait_running_step,
)


@pytest.mark.parametrize("harness", ["builtin", "pi"])
def test_machine_reboot(harness, fault_row):
    fault_row.scenario = "machine reboot (second dockerd)" + (", pi" if harness == "pi" else "")
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
        idle = world.spawn({**demo, "checkpoint": True}, "write idle.txt: idle-before")
        busy = world.spawn(demo, "write busy.txt: busy-before")
        assert not invariants.settle(world, [idle, busy], invariants.WAIT_SETTLE)
        world.send(busy, "prompt", "write mid.txt: mid-before\nsleep: 7.7\nrun: echo after")
        wait_running_step(world, busy, "sleep 7.7")
        before = {a: restored_count(world.events(a)) for a in (idle, busy)}
        sids = {a: world.agent(a)["sandbox_id"] for a in (idle, busy)}

        server.kill()
        killed = engine.reboot()
        print(f"[faults] reboot: SIGKILLed {({k: len(v) for k, v in killed.items()})}")
        assert killed["dockerd"] and killed["shim"] and killed["container"], killed
        engine.start()
        states = {a: engine.docker("inspect", "-f", "{{.State.Status}}", sid).stdout.decode().strip()
                  for a, sid in sids.items()}
        print(f"[faults] after the reboot the containers are {states}")
        assert set(states.values()) == {"exited"}, states
        server.start()

        rungs = []
        for agent in (idle, busy):
            events = world.wait_for(agent, lambda evs, a=agent: restored_count(evs) > before[a],
                                    "the ladder after the reboot")
            new = [e for e in events if e["type"] in ("agent.restored", "agent.lost")][before[agent]:]
            rungs += [e["data"].get("rung", "lost") for e in new]
        fault_row.add_rungs(rungs)
        violations = invariants.check(world)
        fault_row.iterations = 1
        fault_row.violations += violations
        if violations:
            print("\n".join(violations))
            for agent in (idle, busy):
                print(excerpt(world, agent, width=30))
        assert rungs == ["restart", "restart"], rungs
        for agent in (idle, busy):
            assert world.agent(agent)["sandbox_id"] == sids[agent], "the same container, started again"
        interrupted = [e["data"] for e in world.events(busy) if e["type"] == "turn.interrupted"]
        assert len(interrupted) == 1, interrupted
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
