#!/usr/bin/env python
"""50 idle sandboxes at once: what they cost the control plane and the machine.

50 docker containers from the base image run the bridge placeholder (a
sleeping python3, sandboxes.backends.base.PLACEHOLDER_COMMAND) under
docker-init, network none, started 4 at a time through DockerBackend.
Reported:
- control-plane memory: this process's RSS (VmRSS) before and with 50 running
  (it holds one DockerBackend and the 50 ids) — target: < 1 MB per sandbox;
- per-container cost: MemAvailable drop / 50 (reference), and the containers'
  own cgroup memory usage (memory.usage_in_bytes, cgroup v1) — info;
- an exec answered with 50 running, and status() of all 50 (info).
Every container carries alineo.bench=<run id> and is removed at the end.
"""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

N = 50
RUN = uuid.uuid4().hex[:8]
LABELS = {"alineo.bench": RUN}


def proc_mb(path: str, key: str) -> float:
    """The `key:  N kB` line of a /proc file, in MB (nan when it has none)."""
    with open(path) as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb() -> float:
    return proc_mb("/proc/self/status", "VmRSS")


def mem_available_mb() -> float:
    return proc_mb("/proc/meminfo", "MemAvailable")


def cgroup_usage_mb(cid: str) -> float | None:
    for path in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes",
                 f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current"):
        try:
            return int(Path(path).read_text()) / 1e6
        except (OSError, ValueError):
            continue
    return None


LIMITS = {"memory_mb": 256, "pids": 64}


@dataclass
class Readings:
    """What one run saw, before and with the sandboxes running."""

    n: int
    rss0: float
    avail0: float
    rss1: float = 0.0
    avail1: float = 0.0
    usage: list[float] = field(default_factory=list)
    started_s: float = 0.0
    status_s: float = 0.0
    exec_s: float = 0.0


def warm_up(backend, made: list[str]) -> None:
    """Warm the client (connection pools, imports) before the baseline reading."""
    warm = backend.create("bench-idle-warm", "default", labels=LABELS, limits=LIMITS)
    made.append(warm)
    backend.start(warm)
    backend.exec(warm, ["true"])
    time.sleep(1)


def start_idle(backend, n: int, made: list[str]) -> tuple[list[str], float]:
    """n sandboxes started 4 at a time; their ids and the seconds it took."""
    def one(i: int) -> str:
        sid = backend.create(f"bench-idle-{i}", "default", labels=LABELS, limits=LIMITS)
        made.append(sid)
        backend.start(sid)
        return sid

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        sids = list(pool.map(one, range(n)))
    return sids, time.perf_counter() - t0


def measure(backend, n: int, made: list[str]) -> Readings:
    from sandboxes.backends.base import SandboxStatus

    warm_up(backend, made)
    got = Readings(n, rss_mb(), mem_available_mb())
    sids, got.started_s = start_idle(backend, n, made)
    time.sleep(3)  # let the placeholders settle
    got.rss1, got.avail1 = rss_mb(), mem_available_mb()
    got.usage = [u for u in (cgroup_usage_mb(s) for s in sids) if u is not None]
    t1 = time.perf_counter()
    states = [backend.status(s) for s in sids]
    got.status_s = time.perf_counter() - t1
    assert all(s is SandboxStatus.RUNNING for s in states), states
    t2 = time.perf_counter()
    assert backend.exec(sids[n // 2], ["true"]).ok
    got.exec_s = time.perf_counter() - t2
    return got


def idle_rows(got: Readings) -> list[dict]:
    n, usage = got.n, got.usage
    per_sandbox_kb = (got.rss1 - got.rss0) * 1024 / n
    drop = (got.avail0 - got.avail1) / n
    return [
        C.row(
            f"idle: control-plane RSS per sandbox, {n} running", per_sandbox_kb, got.rss0, None,
            "< 1024 KB/sandbox", per_sandbox_kb < 1024, "",
            note=(f"KB per sandbox; baseline = bench process RSS in MB before; RSS "
                  f"{got.rss0:.1f} -> {got.rss1:.1f} MB with {n} running; {n} started in "
                  f"{got.started_s:.1f} s (4 threads)")),
        C.row(
            f"idle: machine memory per sandbox ({n})", drop,
            C.median(usage) if usage else None, None, "info", "info", "MB",
            note=(f"MemAvailable {got.avail0:.0f} -> {got.avail1:.0f} MB; baseline = median "
                  f"container cgroup usage (max {max(usage) if usage else float('nan'):.1f} MB); "
                  "MemAvailable also moves with other jobs on the machine")),
        C.row(
            f"idle: exec / status of {n} with {n} running", got.exec_s * 1000, got.status_s * 1000,
            None, "info", "info", "ms",
            note="measured = one exec('true') answered; baseline = status() of all"),
    ]


def remove_all(backend, made: list[str]) -> float:
    """Remove every sandbox made (4 at a time); the seconds it took."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(backend.remove, list(made)))
    left = backend.list(LABELS)
    removal = time.perf_counter() - t0
    if left:
        print(f"!!! {len(left)} containers left with alineo.bench={RUN}", file=sys.stderr)
    return removal


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    n = 20 if args.quick else N
    from sandboxes.backends import docker_engine_answers

    if not docker_engine_answers():
        C.emit([C.row("idle sandboxes: docker", "skipped", "-", None, "-", "info",
                      note="no Docker engine answers")], args)
        return 0
    from sandboxes import images
    from sandboxes.backends.docker import DockerBackend

    images.ensure_base_image()
    backend = DockerBackend()
    backend.client.ping()
    made: list[str] = []
    try:
        rows = idle_rows(measure(backend, n, made))
    finally:
        removal = remove_all(backend, made)
    rows[-1]["note"] += f"; {len(made)} removed in {removal:.1f} s"
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
