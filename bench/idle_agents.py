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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

N = 50
RUN = uuid.uuid4().hex[:8]
LABELS = {"alineo.bench": RUN}


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def mem_available_mb() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cgroup_usage_mb(cid: str) -> float | None:
    for path in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes",
                 f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current"):
        try:
            return int(Path(path).read_text()) / 1e6
        except (OSError, ValueError):
            continue
    return None


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    n = 20 if args.quick else N
    from sandboxes.backends.base import SandboxStatus, docker_engine_answers

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
    rows = []
    try:
        # Warm the client (connection pools, imports) before the baseline reading.
        warm = backend.create("bench-idle-warm", "default", labels=LABELS,
                              limits={"memory_mb": 256, "pids": 64})
        made.append(warm)
        backend.start(warm)
        backend.exec(warm, ["true"])
        time.sleep(1)
        rss0, avail0 = rss_mb(), mem_available_mb()

        def one(i: int) -> str:
            sid = backend.create(f"bench-idle-{i}", "default", labels=LABELS,
                                 limits={"memory_mb": 256, "pids": 64})
            made.append(sid)
            backend.start(sid)
            return sid

        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            sids = list(pool.map(one, range(n)))
        started = time.perf_counter() - t0
        time.sleep(3)  # let the placeholders settle
        rss1, avail1 = rss_mb(), mem_available_mb()
        usage = [u for u in (cgroup_usage_mb(s) for s in sids) if u is not None]
        t1 = time.perf_counter()
        states = [backend.status(s) for s in sids]
        status_s = time.perf_counter() - t1
        assert all(s is SandboxStatus.RUNNING for s in states), states
        t2 = time.perf_counter()
        assert backend.exec(sids[n // 2], ["true"]).ok
        exec_s = time.perf_counter() - t2

        per_sandbox_kb = (rss1 - rss0) * 1024 / n
        rows.append(C.row(
            f"idle: control-plane RSS per sandbox, {n} running", per_sandbox_kb, rss0, None,
            "< 1024 KB/sandbox", per_sandbox_kb < 1024, "",
            note=(f"KB per sandbox; baseline = bench process RSS in MB before; RSS "
                  f"{rss0:.1f} -> {rss1:.1f} MB with {n} running; {n} started in "
                  f"{started:.1f} s (4 threads)")))
        drop = (avail0 - avail1) / n
        rows.append(C.row(
            f"idle: machine memory per sandbox ({n})", drop,
            C.median(usage) if usage else None, None, "info", "info", "MB",
            note=(f"MemAvailable {avail0:.0f} -> {avail1:.0f} MB; baseline = median "
                  f"container cgroup usage (max {max(usage) if usage else float('nan'):.1f} MB); "
                  "MemAvailable also moves with other jobs on the machine")))
        rows.append(C.row(
            f"idle: exec / status of {n} with {n} running", exec_s * 1000, status_s * 1000,
            None, "info", "info", "ms",
            note="measured = one exec('true') answered; baseline = status() of all"))
    finally:
        t3 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(backend.remove, list(made)))
        left = backend.list(LABELS)
        removal = time.perf_counter() - t3
        if left:
            print(f"!!! {len(left)} containers left with alineo.bench={RUN}", file=sys.stderr)
    if rows:
        rows[-1]["note"] += f"; {len(made)} removed in {removal:.1f} s"
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
