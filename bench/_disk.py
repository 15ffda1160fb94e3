"""The disk side of bench/checkpoint_restore.py: the floor (host `zstd -dc |
tar -x` of the same checkpoint), waiting for the disk to settle before a
timed run, and the spans of the calls that make a restore."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


def ms_list(xs: list[float]) -> str:
    """Seconds as a row note lists them: whole ms, comma-separated."""
    return ", ".join(f"{x * 1000:.0f}" for x in xs)


def settle_disk(path: Path, limit_s: float = 30.0) -> float:
    """Flush dirty pages and wait (not timed) until the disk under ``path``
    has finished what earlier runs gave it: nothing in flight and no write or
    discard completed for 0.3 s (/proc/diskstats). On this VM the deletions of
    one run (its homes, the floor's directory) cost the disk seconds after
    they return: without this, whichever run came next paid for them — the
    floor, first in its round, by up to 5x. Returns the seconds waited."""
    t0 = time.monotonic()
    os.sync()
    dev = os.stat(path).st_dev
    key = f"{os.major(dev)} {os.minor(dev)}"

    def stats() -> tuple | None:
        with open("/proc/diskstats") as fh:
            for line in fh:
                parts = line.split()
                if f"{parts[0]} {parts[1]}" == key:
                    return tuple(parts[3:])
        return None

    last, quiet_since = stats(), time.monotonic()
    while last is not None and time.monotonic() - t0 < limit_s:
        time.sleep(0.05)
        now = stats()
        if now != last or int(now[8]) > 0:  # field 9: I/Os in flight
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= 0.3:
            break
    return time.monotonic() - t0


def host_floor(ckpt: Path, dest: Path) -> float:
    """The floor: the same checkpoint unpacked by host zstd | tar on the same
    disk. The disk is settled first (not timed), as before every restore:
    each run starts from the same state."""
    dest.mkdir()
    settle_disk(dest)
    f0 = time.perf_counter()
    subprocess.run(f"zstd -dc -q {ckpt} | tar -x -C {dest} -f -", shell=True, check=True)
    floor = time.perf_counter() - f0
    shutil.rmtree(dest)
    return floor


class Spans:
    """(start, end) of the calls that make a restore, recorded while it runs
    (the home's extraction overlaps the container's start)."""

    def __init__(self, backend):
        from sandboxes import archive

        self.spans: dict[str, tuple[float, float]] = {}
        self._undo = []
        for name, owner, attr in (("create", backend, "create"), ("start", backend, "start"),
                                  ("extract", archive, "restore_checkpoint")):
            self._wrap(name, owner, attr)

    def _wrap(self, name, owner, attr):
        real = getattr(owner, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.spans.setdefault(name, (t0, time.perf_counter()))
        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, real))

    def close(self):
        for undo in self._undo:
            undo()


def load() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
