"""The docker sandbox tried as the local one is in test_local_sandbox.py: a
live server on the docker backend, an agent of one workspace probing through
the demo model's `run:` lines for what belongs to the control plane or to
another workspace. Each refusal has its control beside it (the agent's own
file, an allocation within the limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.worlds import DEMO, World, start_server, cleanup_sandboxes
from tests.security.test_local_sandbox import (
    ALLOCATE,
    connect_line,
    first_turn,
    py,
    refused_memory,
    said,
)

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def world():
    server = start_server("docker")  # fails under CI without an engine, skips loudly elsewhere
    server.start()
    try:
        yield World(server, server.create_actor("mallory"), "docker")
    finally:
        server.stop()
        cleanup_sandboxes(server, "docker")
        server.__exit__(None, None, None)


def test_the_control_plane_and_another_workspace_are_out_of_reach(world):
    victim = World(world.server, world.server.create_actor("victor"), "docker")
    _, mine = first_turn(victim, DEMO, "write secret.txt: other-workspaces-secret-4711")
    assert mine[0]["is_error"] is False
    data = world.server.data_dir
    secret_key = (data / "secret_key").read_text().strip()
    shadow_root = next(line for line in Path("/etc/shadow").read_text().splitlines()
                       if line.startswith("root:"))
    targets = [data / "alineo.sqlite3", data / "secret_key", data / "run"]
    lines = ([f"run: cat {t}" for t in targets]
             + ["run: cat /etc/shadow", "run: ls -a / /run/alineo",
                "run: grep -rl other-workspaces-secret / --exclude-dir=proc --exclude-dir=sys "
                "2>/dev/null | head -5",
                connect_line(world.server.port),
                py("import os\nprint('CAPS', open('/proc/self/status').read().split('CapEff:')[1]"
                   ".split()[0], 'NNP', open('/proc/self/status').read().split('NoNewPrivs:')[1]"
                   ".split()[0])"),
                "write mine.txt: my-own-file", "read: mine.txt"])
    _, results = first_turn(world, DEMO, "\n".join(lines))
    output = json.dumps(results)
    for needle in ("SQLite format", secret_key, "other-workspaces-secret-4711", shadow_root):
        assert needle not in output, f"the sandbox read {needle!r}: {output[:3000]}"
    for target, result in zip(targets, results):
        assert result["exit_code"] != 0 and "No such file" in said(result), (target, result)
    listing = results[len(targets) + 1]["output"]
    assert "bridge.sock" in listing and "alineo.sqlite3" not in listing  # its own run dir only
    assert "REFUSED" in results[len(targets) + 3]["output"], results[len(targets) + 3]
    caps = results[len(targets) + 4]["output"].split()
    assert caps[:4] == ["CAPS", "0000000000000000", "NNP", "1"], caps  # no capability, no setuid
    assert "my-own-file" in str(results[-1]["output"])  # the control: its own file


def test_memory_and_pids_limits_hold(world):
    _, results = first_turn(world, {**DEMO, "limits": {"memory_mb": 64}}, ALLOCATE)
    assert refused_memory(results[0]["exit_code"], results[0]["output"]), results[0]
    _, results = first_turn(world, {**DEMO, "limits": {"memory_mb": 1024}}, ALLOCATE)
    assert "ALLOCATED" in results[0]["output"], results[0]  # the control
    forks = py("import os, time\nn = 0\nwhile n < 2000:\n  try:\n    pid = os.fork()\n"
               "  except OSError:\n    break\n  if pid == 0:\n    time.sleep(3)\n    os._exit(0)\n"
               "  n += 1\nprint('FORKED', n)")
    _, results = first_turn(world, {**DEMO, "limits": {"pids": 64}}, forks)
    forked = int(results[0]["output"].split("FORKED")[1].split()[0])
    assert forked < 64, results[0]
