#!/usr/bin/env python
"""Turn checkpoints and restore, on the docker backend (local for reference).

Home: 5,000 files / ~50 MB under ~/work (75% text, 25% random) plus what the
checkpoint leaves out: a 200 MB ~/.cache (random), 5 MB of ~/.npm and 100
__pycache__/*.pyc files.

- checkpoint (target < 0.5 s and <= 1.5x): sandboxes.archive.store_checkpoint
  (exec'd tar with the cache exclusions, streamed out of the container,
  zstd-1 on the host while it streams, fsync, rename) against a plain
  `tar -cf - <same excludes> . | zstd -1 -T0 > file` run on the host over the
  same files (the container's merged overlay dir; the local sandbox's home),
  in the same run, interleaved. Medians of the repetitions; the ratio is the
  median of per-pair ratios.
- restore and fork (targets < 1.5 s warm and <= 1.3x the floor, issue 17), on
  docker and (the same checkpoint) on the local backend:
  what the ladder's restore rung and a fork run, sandboxes/launch.py
  build_fresh from the checkpoint (the run dir, a host-dir home filled while
  the container is created and started, the seal), then the first answered
  exec. "restore" is the same agent again after `docker rm -f` of its
  container (its old home left behind, as after a real loss); "fork" is a new
  agent. The floor is host `zstd -dc | tar -x` of the same checkpoint into a
  directory on the same disk, in the same round; the ratio is the median of
  the per-round ratios. Where the backend lays homes over prepared trees (a
  root control plane), the same rounds also restore and fork over the
  checkpoint's tree (extracted once before the rounds, as the worker does
  after each turn checkpoint: an info row gives that cost); the extracting
  rows then run with ALINEO_PREPARED_TREES=0, ruled by their ratio only.
  The engine's put_archive path (ALINEO_DOCKER_HOST_TAR=0)
  runs in the same rounds for reference. One warm-up round; the removals are
  not timed, and each run first waits (untimed) until no home set aside by
  an earlier restore is still being deleted and the disk has settled
  (settle_disk); the order of floor, restore, fork and engine is reversed
  every other round; a restore's time includes the worker's plan reading
  the session file (the home holds one, as every agent's does); rounds stop after
  BENCH_RESTORE_BUDGET_S (420 s) per size; BENCH_RESTORE_30K=0 skips the
  30k rows.

Every container carries the label alineo.bench=<run id> and is removed at the
end (also on failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402
from bench import _disk as D  # noqa: E402

RUN = uuid.uuid4().hex[:8]
#: No new round of one size starts after this many seconds (at least 1 after the warm-up).
ROUNDS_BUDGET_S = float(os.environ.get("BENCH_RESTORE_BUDGET_S", "420"))
LABELS = {"alineo.bench": RUN}

FILL = r"""
import os, random
home = os.environ["HOME"]
r = random.Random(7)
N, SIZE = int(os.environ.get("FILL_FILES", "5000")), int(os.environ.get("FILL_SIZE", "10000"))
text = b"".join(b"line %d of some source text, words words words\n" % i for i in range(400))
for i in range(N):
    d = os.path.join(home, "work", "d%02d" % (i % 50))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.txt" % i), "wb") as f:
        f.write(os.urandom(SIZE) if i % 4 == 0 else (text * 1)[:SIZE])
for j in range(100):
    d = os.path.join(home, "work", "pkg%02d" % (j % 10), "__pycache__")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "m%d.pyc" % j), "wb").write(os.urandom(2000))
os.makedirs(os.path.join(home, ".npm", "_cacache"), exist_ok=True)
open(os.path.join(home, ".npm", "_cacache", "blob"), "wb").write(os.urandom(5 << 20))
os.makedirs(os.path.join(home, ".cache"), exist_ok=True)
with open(os.path.join(home, ".cache", "big.bin"), "wb") as f:
    for _ in range(200):
        f.write(os.urandom(1 << 20))
# The bridge's session file, as in every real agent's home: a restore reads it
# (the worker's plan, then beside the extraction) before the bridge starts.
import json
os.makedirs(os.path.join(home, ".alineo"), exist_ok=True)
messages = [{"role": "user", "text": "prompt %d " % k * 20, "kind": "prompt"} if k % 2 == 0
            else {"role": "assistant", "text": "reply %d " % k * 20, "tool_calls": []}
            for k in range(40)]
with open(os.path.join(home, ".alineo", "session.json"), "w") as f:  # sandboxes/bridge/session.py
    json.dump({"version": 1, "session_id": "bench", "created_at": "2026-12-01T00:00:00+00:00",
               "bseq": 120, "acked": 120, "outbox": [], "messages": messages, "turns": 20,
               "queue": [], "current": None, "seen_commands": []}, f)
"""


def plain_tar_zstd(home: str, out: Path) -> float:
    from sandboxes.backends.base import HOME_EXCLUDES

    t0 = time.perf_counter()
    with open(out, "wb") as fh:
        tar = subprocess.Popen(["tar", "-C", home, "-cf", "-", *HOME_EXCLUDES, "."],
                               stdout=subprocess.PIPE)
        z = subprocess.run(["zstd", "-1", "-T0", "-q", "-c"], stdin=tar.stdout, stdout=fh)
        tar.stdout.close()
        tar.wait()
        fh.flush()
        os.fsync(fh.fileno())
    assert z.returncode == 0 and tar.returncode in (0, 1)
    return time.perf_counter() - t0


def measure_checkpoint(backend, sid, host_home, work: Path, reps: int, label: str):
    from sandboxes.archive import store_checkpoint

    ours, plain, ratios, sizes = [], [], [], []
    for i in range(reps):
        first_ours = i % 2 == 0
        for which in ((0, 1) if first_ours else (1, 0)):
            if which == 0:
                stored = store_checkpoint(backend, sid, "bench", i, root=work / label)
                ours.append(stored.ms / 1000)
                sizes.append(stored.bytes)
            else:
                plain.append(plain_tar_zstd(host_home, work / f"{label}-plain-{i}.tar.zst"))
        ratios.append(ours[-1] / plain[-1])
    plain_size = (work / f"{label}-plain-0.tar.zst").stat().st_size
    return ours, plain, ratios, sizes[-1], plain_size


def one_restore(backend, ckpt: Path, made: list[str], agent: str) -> tuple[float, float, dict]:
    """What the ladder's restore rung and a fork run (sandboxes/launch.py
    build_fresh: the run dir, create, the checkpoint and its session file,
    start) -> the first answered exec: seconds of (build_fresh, first exec)
    and the spans inside build_fresh (ms from its start). The removal after
    it is not timed."""
    from sandboxes import archive, launch

    settle_homes()
    D.settle_disk(ckpt)
    spans = D.Spans(backend)
    t0 = time.perf_counter()
    try:
        # The worker's plan reads the checkpoint's session file first
        # (sessions/worker/plans.py), then builds the sandbox.
        assert archive.session_in(ckpt) is not None, "the bench's checkpoint holds no session"
        spans.spans["plan"] = (t0, time.perf_counter())
        sid = launch.build_fresh(backend, launch.Launch(agent, {"model": "demo"}),
                                 launch.Fresh(checkpoint=str(ckpt), labels=LABELS))
    finally:
        spans.close()
    made.append(sid)
    took = time.perf_counter() - t0
    rel = {k: ((a - t0) * 1000, (b - t0) * 1000) for k, (a, b) in spans.spans.items()}
    return took, first_exec_then_remove(backend, sid, made), rel


def settle_homes(limit_s: float = 120) -> None:
    """Wait (not timed) until no home set aside by an earlier restore is still
    being deleted on its thread, so that no run pays for another's removal."""
    from sandboxes.backends import hosthome

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and hosthome.root().is_dir() and any(
            p.name.startswith(hosthome.TRASH) for p in hosthome.root().iterdir()):
        time.sleep(0.05)


def first_exec_then_remove(backend, sid: str, made: list[str]) -> float:
    """Seconds until the first exec answered (the home's 60 dirs are there);
    the removal after it is not timed."""
    t0 = time.perf_counter()
    out = backend.exec(sid, ["sh", "-c", "ls work | wc -l"], timeout=30)
    took = time.perf_counter() - t0
    assert out.ok and out.text.strip() == "60", out
    backend.remove(sid)
    made.remove(sid)
    return took


def rm_f_then_restore(backend, ckpt: Path, made: list[str], agent: str):
    """The restore rung after `docker rm -f`: the agent's container vanished
    (its host-dir home, if any, is left behind), then build_fresh for the
    same agent -> first exec."""
    sid = one_restore_keep(backend, ckpt, made, agent)
    if backend.name == "docker":
        backend.client.api.remove_container(sid, force=True, v=True)  # behind the backend's back
    else:
        backend.remove(sid)  # the local backend: the sandbox and its home are gone
    made.remove(sid)
    return one_restore(backend, ckpt, made, agent)


def one_restore_keep(backend, ckpt: Path, made: list[str], agent: str) -> str:
    from sandboxes import launch

    sid = launch.build_fresh(backend, launch.Launch(agent, {"model": "demo"}),
                             launch.Fresh(checkpoint=str(ckpt), labels=LABELS))
    made.append(sid)
    return sid


def _split(runs: list[tuple]) -> str:
    """Median spans (ms from build_fresh's start) of the runs' create, extract, start."""
    parts = []
    for name in ("plan", "create", "extract", "start"):
        got = [r[2][name] for r in runs if name in r[2]]
        if got:
            parts.append(f"{name} {C.median([a for a, _ in got]):.0f}-{C.median([b for _, b in got]):.0f}")
    return ", ".join(parts) + f"; first exec {C.median([r[1] for r in runs]) * 1000:.0f} ms"


def _restore_rows(backend, ckpt: Path, work: Path, reps: int, made: list[str], what: str,
                  engine_too: bool) -> list[dict]:
    """Floor, restore (after `docker rm -f`), fork, both again laid over the
    checkpoint's prepared tree (where the backend can), and (``engine_too``)
    the same restore through the engine's put_archive, interleaved, one
    warm-up round."""
    trees_too = backend.prepares_trees()
    prepared = prepare_tree(ckpt, work, backend.tree_owners) if trees_too else None
    got_all: dict[str, list] = {k: [] for k in ("floor", "restore", "fork", "engine",
                                                "tree-restore", "tree-fork")}
    deadline = time.monotonic() + ROUNDS_BUDGET_S
    for i in range(reps + 1):
        if i > 1 and time.monotonic() > deadline:
            break  # a loaded disk: fewer rounds, said in the row's note (bench/run's limit)
        runs = {
            "floor": lambda: D.host_floor(ckpt, work / f"floor-{i}"),
            "restore": lambda: extracting(rm_f_then_restore, backend, ckpt, made,
                                          f"bench-restore-{RUN}"),
            "fork": lambda: extracting(one_restore, backend, ckpt, made, f"bench-fork-{RUN}-{i}"),
            "engine": lambda: engine_restore(backend, ckpt, made) if engine_too else None,
            "tree-restore": lambda: (rm_f_then_restore(backend, ckpt, made, f"bench-trestore-{RUN}")
                                     if trees_too else None),
            "tree-fork": lambda: (one_restore(backend, ckpt, made, f"bench-tfork-{RUN}-{i}")
                                  if trees_too else None),
        }
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]  # no kind always first
        got = {kind: runs[kind]() for kind in order}
        if i > 0:  # the first round warms caches up
            for kind, value in got.items():
                if value is not None:
                    got_all[kind].append(value)
    floors = got_all["floor"]
    lost = "after rm -f" if backend.name == "docker" else "after its sandbox was removed"
    rows = []
    if trees_too:
        rows += [
            _ratio_row(f"restore: {backend.name}, {what}, {lost}, over the prepared tree -> 1st exec",
                       got_all["tree-restore"], floors),
            _ratio_row(f"fork: {backend.name}, {what}, from the prepared checkpoint -> 1st exec",
                       got_all["tree-fork"], floors),
            C.row(f"prepare the tree: {backend.name}, {what} (in the background, after the checkpoint)",
                  prepared[0] * 1000, prepared[1] * 1000, prepared[0] / prepared[1], "info", "info", "ms",
                  note=("trees.prepare (the checked stream into GNU tar) against the floor measured "
                        "just before it; the worker runs it at nice 19 after each turn checkpoint"))]
    ruled = not trees_too  # with trees, extracting is the fallback: only its ratio is ruled
    rows += [_ratio_row(f"restore: {backend.name}, {what}, {lost}, extracting -> 1st exec",
                        got_all["restore"], floors, absolute=ruled),
             _ratio_row(f"fork: {backend.name}, {what}, from a checkpoint, extracting -> 1st exec",
                        got_all["fork"], floors, absolute=ruled)]
    if engine_too:
        engine = got_all["engine"]
        total = [e[0] + e[1] for e in engine]
        rows.append(C.row(
            f"restore: docker, {what}, the engine's put_archive (reference)",
            C.median(total) * 1000, C.median(floors) * 1000,
            C.median([t / f for t, f in zip(total, floors)]), "info", "info", "ms",
            note=(f"ALINEO_DOCKER_HOST_TAR=0 (no host-dir home: put_archive, then start), "
                  f"interleaved with the rows above; runs {D.ms_list(total)} ms; median spans "
                  + _split(engine))))
    return rows


def prepare_tree(ckpt: Path, work: Path, owners: str) -> tuple[float, float]:
    """(seconds of trees.prepare, seconds of the floor just before it)."""
    from sandboxes.backends import trees

    floor = D.host_floor(ckpt, work / f"floor-prepare-{owners}")
    D.settle_disk(ckpt)
    t0 = time.perf_counter()
    trees.prepare(ckpt, owners)
    return time.perf_counter() - t0, floor


def extracting(run, *args):
    """``run(*args)`` with no prepared tree used (ALINEO_PREPARED_TREES=0):
    the restore a checkpoint gets before its tree is ready."""
    from django.conf import settings

    was, settings.ALINEO_PREPARED_TREES = settings.ALINEO_PREPARED_TREES, False
    try:
        return run(*args)
    finally:
        settings.ALINEO_PREPARED_TREES = was


def engine_restore(backend, ckpt: Path, made: list[str]):
    """:func:`one_restore` through the engine's archive API, as before issue 17."""
    from django.conf import settings

    was, settings.ALINEO_DOCKER_HOST_TAR = settings.ALINEO_DOCKER_HOST_TAR, False
    try:
        return one_restore(backend, ckpt, made, f"bench-engine-{RUN}")
    finally:
        settings.ALINEO_DOCKER_HOST_TAR = was


def _ratio_row(name: str, runs: list[tuple], floors: list[float], absolute: bool = True) -> dict:
    times = [r[0] + r[1] for r in runs]
    med = C.median(times)
    ratio = C.median([t / f for t, f in zip(times, floors)])
    target = "< 1500 ms warm and <= 1.3x" if absolute else "<= 1.3x (fallback)"
    return C.row(
        name, med * 1000, C.median(floors) * 1000, ratio, target,
        (med < 1.5 or not absolute) and ratio <= 1.3, "ms",
        note=(f"median of {len(times)} after 1 warm-up; runs {D.ms_list(times)} ms; per-run ratios "
              f"{', '.join(f'{t / f:.2f}' for t, f in zip(times, floors))}; median spans (ms from "
              f"build_fresh's start) {_split(runs)}; baseline = host `zstd -dc | tar -x` of the same "
              f"checkpoint into a dir on the same disk (the floor), runs {D.ms_list(floors)} ms; "
              f"the disk settled (not timed: settle_disk) before each run, the order of the "
              f"kinds reversed every other round; {D.load()} at the row's end"))


def filled_checkpoint(backend, work: Path, files: int, size: int, made: list[str]) -> Path:
    """A container filled with ``files`` files of ``size`` bytes (and the caches
    a checkpoint leaves out), checkpointed once; the container is removed."""
    from sandboxes.archive import store_checkpoint

    sid = backend.create("bench-ckpt", "default", labels=LABELS, limits={"memory_mb": 2048, "pids": 512})
    made.append(sid)
    backend.start(sid)
    res = backend.exec(sid, ["sh", "-c", f"FILL_FILES={files} FILL_SIZE={size} exec python3 -c \"$0\"", FILL],
                       timeout=600)
    assert res.ok, res.stderr
    path = store_checkpoint(backend, sid, "bench", 0, root=work / f"docker-{files}").path
    backend.remove(sid)
    made.remove(sid)
    return path


def docker_rows(backend, work: Path, reps: int, restore_reps: int, made: list[str]) -> list[dict]:
    """Checkpoint a filled container, then restore that checkpoint into fresh ones."""
    sid = backend.create("bench-ckpt", "default", labels=LABELS, limits={"memory_mb": 2048, "pids": 512})
    made.append(sid)
    backend.start(sid)
    res = backend.exec(sid, ["python3", "-c", FILL], timeout=600)
    assert res.ok, res.stderr
    merged = backend.inspect(sid)["GraphDriver"]["Data"]["MergedDir"] + "/root"
    ours, plain, ratios, size, plain_size = measure_checkpoint(backend, sid, merged, work, reps, "docker")
    m, p, r = C.median(ours), C.median(plain), C.median(ratios)
    rows = [C.row(
        "checkpoint: docker, 5k files/50 MB + 200 MB cache", m * 1000, p * 1000, r,
        "< 500 ms and <= 1.5x", m < 0.5 and r <= 1.5, "ms",
        note=(f"store_checkpoint runs {D.ms_list(ours)} ms; host tar|zstd -1 -T0 of the container's merged dir "
              f"{D.ms_list(plain)} ms; {size / 1e6:.1f} MB vs {plain_size / 1e6:.1f} MB compressed"))]
    ckpt = work / "docker" / "bench" / f"{sid}-turn-{reps - 1}.tar.zst"
    backend.remove(sid)
    made.remove(sid)
    rows += _restore_rows(backend, ckpt, work, restore_reps, made, "5k files/50 MB", True)
    rows += local_restore_rows(ckpt, work, restore_reps, "5k files/50 MB")
    C.print_table(rows, out=sys.stderr)  # so far (the 30k rounds are slow on a busy disk)
    if os.environ.get("BENCH_RESTORE_30K", "1") == "0":
        return rows
    big = filled_checkpoint(backend, work, 30_000, 2_000, made)
    rows += _restore_rows(backend, big, work, max(2, restore_reps // 2), made, "30k files/60 MB", False)
    rows += local_restore_rows(big, work, max(2, restore_reps // 2), "30k files/60 MB")
    return rows


def local_restore_rows(ckpt: Path, work: Path, reps: int, what: str) -> list[dict]:
    """The same checkpoint (made on docker: checkpoints are portable) restored
    and forked on the local backend (bubblewrap), against the same floor."""
    from sandboxes.backends.local import LocalBackend

    local = LocalBackend(root=work / "local-restores")
    made: list[str] = []
    try:
        return _restore_rows(local, ckpt, work, reps, made, what, False)
    finally:
        remove_quietly(local, made)


def local_row(work: Path, reps: int) -> dict:
    """The local backend's checkpoint of the same home, for reference."""
    from sandboxes.backends.local import LocalBackend

    local = LocalBackend(root=work / "local-sandboxes")
    lsid = local.create("bench-local", "host", labels=LABELS)
    local.start(lsid)
    try:
        res = local.exec(lsid, ["python3", "-c", FILL], timeout=600)  # the sandbox's python
        assert res.ok, res.stderr
        ours, plain, ratios, size, plain_size = measure_checkpoint(local, lsid, local.host_home(lsid), work, reps, "local")
        m, p, r = C.median(ours), C.median(plain), C.median(ratios)
        return C.row("checkpoint: local (reference)", m * 1000, p * 1000, r, "info", "info", "ms",
                     note=f"store_checkpoint runs {D.ms_list(ours)} ms; tar|zstd {D.ms_list(plain)} ms")
    finally:
        local.remove(lsid)


def remove_quietly(backend, made: list[str]) -> None:
    for sid in made:
        try:
            backend.remove(sid)
        except Exception:  # noqa: BLE001 - cleanup after a failure: remove what can be removed
            pass


def remove_volumes(backend) -> None:
    """The tree homes left by `docker rm -f` (the server's sweep would take them)."""
    for v in backend.client.api.volumes(filters={"label": f"alineo.bench={RUN}"})["Volumes"] or []:
        try:
            backend.client.api.remove_volume(v["Name"], force=True)
        except Exception:  # noqa: BLE001 - cleanup: remove what can be removed
            pass


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    reps = 3 if args.quick else 5
    restore_reps = 3 if args.quick else 6
    rows = []
    work = C.make_data_dir("ckpt", sockets=True)
    os.environ["ALINEO_DATA_DIR"] = str(work)  # the fork's run dir (bridge socket) goes here
    from sandboxes.backends import docker_engine_answers

    backend = None
    made: list[str] = []
    try:
        if docker_engine_answers():
            from sandboxes import images
            from sandboxes.backends.docker import DockerBackend

            images.ensure_base_image()
            backend = DockerBackend()
            rows += docker_rows(backend, work, reps, restore_reps, made)
        else:
            rows.append(C.row("checkpoint/restore: docker", "skipped", "-", None, "-", "info",
                              note="no Docker engine answers"))
        rows.append(local_row(work, reps))
    finally:
        if backend is not None:
            remove_quietly(backend, made)
            remove_volumes(backend)
        shutil.rmtree(work, ignore_errors=True)
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
