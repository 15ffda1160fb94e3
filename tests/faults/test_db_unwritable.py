"""The database becoming unwritable.

ALINEO_DATA_DIR is a small loop-mounted ext4 image (chmod does not stop root,
and SQLite tricks inside the server are not the filesystem failing), and the
fault is the filesystem's:

- `readonly`: the database's files and their directory made immutable
  (`chattr +i`, which stops root too; `mount -o remount,ro` is refused with
  "mount point is busy" while the server holds the files open for writing);
- `full`: the disk filled to the last block (`fallocate` plus a tail written
  until ENOSPC; the image has no root reserve, `mkfs.ext4 -m 0`).

While it lasts, the agent is mid-turn (its bridge keeps emitting events the
relay cannot journal) and a prompt is POSTed: the agent is reported
`unrecoverable` with the reason (GET /api/agents/{id}), the prompt is not
acknowledged (503, nothing written). Then the disk is made writable again: the
same request (same Idempotency-Key) is acknowledged once, the bridge's events
are journaled with no hole and no repeat, the agent's status clears and the
next prompt works — every invariant holds. The docker backend keeps the
sandbox's disk off the broken filesystem (the local backend's homes live in
the data dir, which would break the bridge too: another scenario).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.faults import invariants
from tests.faults.harness import (
    World, cannot_run, cleanup_sandboxes, docker_client, ensure_root, excerpt, make_server,
    wait_running_step,
)
from tests.live import parent_dir

IMAGE_MB = 96


class LoopDisk:
    """A loop-mounted ext4 image of IMAGE_MB MiB; umounted and deleted at the end."""

    def __init__(self):
        for tool in ("mkfs.ext4", "mount", "umount", "fallocate", "chattr"):
            if shutil.which(tool) is None:
                cannot_run(f"{tool} is not installed")
        self.root = Path(tempfile.mkdtemp(prefix="flt-", dir=parent_dir()))
        self.image = self.root / "disk.img"
        self.mnt = self.root / "mnt"
        self.mnt.mkdir()
        self.mounted = False

    def __enter__(self) -> "LoopDisk":
        _run("fallocate", "-l", f"{IMAGE_MB}M", str(self.image))
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        r = subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(self.root, ignore_errors=True)
            cannot_run(f"a loop device cannot be mounted here ({r.stderr.strip()})")
        self.mounted = True
        return self

    def __exit__(self, *exc) -> None:
        if self.mounted:
            self.writable()
            for _ in range(50):
                if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.mounted = False
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def filler(self) -> Path:
        return self.mnt / "filler"

    def readonly(self, data_dir: Path) -> None:
        """The SQLite files (and the dir, so no new -wal/-journal) immutable."""
        self.frozen = [p for p in (data_dir / "alineo.sqlite3", data_dir / "alineo.sqlite3-wal",
                                   data_dir / "alineo.sqlite3-shm") if p.exists()] + [data_dir]
        _run("chattr", "+i", *map(str, self.frozen))

    def fill(self) -> None:
        st = os.statvfs(self.mnt)
        free = st.f_bavail * st.f_frsize
        if free > 1 << 20:
            _run("fallocate", "-l", str(free - (1 << 19)), str(self.filler))
        with open(self.mnt / "filler-tail", "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError:
                pass

    def writable(self) -> None:
        if getattr(self, "frozen", None):
            _run("chattr", "-i", *map(str, self.frozen))
            self.frozen = []
        for p in (self.filler, self.mnt / "filler-tail"):
            p.unlink(missing_ok=True)


def _run(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {r.stderr.strip()}")


@pytest.mark.parametrize("mode", ["readonly", "full"])
def test_database_unwritable(mode, fault_row):
    fault_row.scenario = f"database unwritable: {mode} (docker)"
    ensure_root()
    with LoopDisk() as disk:
        (disk.mnt / "srv").mkdir()
        server = make_server("docker", data_dir=disk.mnt / "srv")
        server.log_path = disk.root / "server.log"  # the log is not what is being broken
        server.start()
        world = None
        try:
            world = World(server, "docker", server.create_actor("dora"))
            agent = world.spawn({"model": "demo", "checkpoint": True}, "write first.txt: first-db")
            assert not invariants.settle(world, [agent], invariants.WAIT_SETTLE)
            world.send(agent, "prompt", "write during.txt: during-db\nsleep: 6.5\nrun: echo after-db > after.txt")
            wait_running_step(world, agent, "sleep 6.5")
            disk.readonly(server.data_dir) if mode == "readonly" else disk.fill()
            try:
                # A command while it lasts: never acknowledged, nothing written.
                key = f"unwritable-{uuid.uuid4().hex[:8]}"
                r = world.http.post(f"{world.url}/api/agents/{agent}/prompt",
                                    json={"text": "say: written while broken"},
                                    headers={**world.actor.auth, "Idempotency-Key": key})
                shown = _wait_unrecoverable(world, agent)
                print(f"[faults] {mode}: POST → {r.status_code} {r.text[:200]}; "
                      f"agent {shown['status']}: {shown['status_reason'][:200]}")
                if r.status_code != 503:
                    fault_row.violations.append(
                        f"a prompt while the database is unwritable answered {r.status_code} "
                        f"{r.text[:300]} (expected 503, nothing written)")
                if shown["status"] != "unrecoverable" or not shown["status_reason"]:
                    fault_row.violations.append(
                        f"{agent}: while the database is unwritable GET shows {shown['status']!r} "
                        f"({shown['status_reason']!r}), not unrecoverable with a reason")
                # Hold the fault past the end of the running step, so the relay
                # too meets the unwritable database (the bridge keeps the events).
                _wait_step_ended(world, agent)
                shown = _wait_unrecoverable(world, agent, timeout=5)
                if shown["status"] != "unrecoverable":
                    fault_row.violations.append(
                        f"{agent}: while the database stays unwritable GET shows "
                        f"{shown['status']!r} ({shown['status_reason']!r})")
            finally:
                disk.writable()
            world.send(agent, "prompt", "say: written while broken", key=key)  # the retry
            world.wait_for(agent, lambda evs: any(e["type"] == "turn.finished"
                                                  and "written while broken" in str(e["data"])
                                                  for e in evs), "the retried prompt's turn")
            shown = world.agent(agent)
            if shown["status"] == "unrecoverable":
                fault_row.violations.append(f"{agent}: still unrecoverable once writable: "
                                            f"{shown['status_reason']}")
            violations = invariants.check(world)
            fault_row.iterations = 1
            fault_row.add_rungs(world.rungs_of([agent]))
            if violations:
                fault_row.violations += violations
            if fault_row.violations:
                print("\n".join(fault_row.violations))
                print(excerpt(world, agent, width=30))
            assert not fault_row.violations, "\n".join(fault_row.violations)
        finally:
            if world is not None:
                world.close()
            server.stop()
            cleanup_sandboxes(server, "docker")


def _wait_step_ended(world: World, agent: str, timeout: float = 60.0) -> None:
    """Wait (bounded) until the step after the running one wrote its file in
    the container, seen through the engine, not the control plane: the bridge
    finished the running step and sent its events, so the relay met the
    unwritable database too."""
    client = docker_client()
    try:
        container = client.containers.get(world.agent(agent)["sandbox_id"])
        deadline = time.monotonic() + timeout
        while container.exec_run(["sh", "-c", 'test -e "$HOME/after.txt"'])[0] != 0:
            assert time.monotonic() < deadline, f"{agent}: the step after `sleep 6.5` never ran"
            time.sleep(0.2)
    finally:
        client.close()


def _wait_unrecoverable(world: World, agent: str, timeout: float = 30.0) -> dict:
    """GET the agent until it shows unrecoverable (bounded); its last answer."""
    deadline = time.monotonic() + timeout
    shown = {"status": "?", "status_reason": ""}
    while time.monotonic() < deadline:
        try:
            r = world.http.get(f"{world.url}/api/agents/{agent}", headers=world.actor.auth)
            if r.status_code == 200:
                shown = r.json()
                if shown["status"] == "unrecoverable":
                    return shown
            else:
                shown = {"status": f"HTTP {r.status_code}", "status_reason": r.text[:300]}
        except httpx.TransportError as exc:
            shown = {"status": "no answer", "status_reason": str(exc)}
        time.sleep(0.3)
    return shown
