#!/usr/bin/env python
"""Backup and restore of a deployment with 20 checkpointing agents.

The data: 20 agents, each with a 700-fact transcript (100 turns), memory
notes and 3 live turn checkpoints (the newest 3 are kept) of a ~4 MB home
(75% text, 25% random bytes, tar + zstd-1 as the worker writes them, ~1.2 MB
each), plus 1 deleted checkpoint row per agent whose file is gone.

- backup: sessions.backup.write_bundle (online SQLite copy through the backup
  API, checkpoint files copied while hashed, fsynced, manifest, rename) with
  --no-images; against a plain `cp -a` of the data dir (not consistent under
  writers: the floor, not a peer). Median of the repetitions.
- restore: sessions.backup.restore_bundle into a fresh data dir (verify every
  sha256 and integrity_check first, stage, rewrite checkpoint paths, rename);
  against `cp -a` of the bundle.
- bundle size (MB), info.
- with Docker: `docker save` of the base image into a bundle (info; a
  scheduled backup in the same directory hardlinks an unchanged image).
Targets: backup and restore each under 10 s for these 20 agents.
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import sys
import tarfile
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C

AGENTS = 20
FACTS = 700
KEEP = 3
HOME_FILES = 200
FILE_BYTES = 20_000


def home_tar_zst(seed: int) -> bytes:
    import zstandard

    rng = random.Random(seed)
    text = b"".join(b"def f%d(x):\n    return x * %d  # some source text\n" % (i, i) for i in range(600))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(HOME_FILES):
            data = rng.randbytes(FILE_BYTES) if i % 4 == 0 else text[i:i + FILE_BYTES]
            ti = tarfile.TarInfo(f"./work/d{i % 10}/f{i}.py")
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return zstandard.ZstdCompressor(level=1).compress(buf.getvalue())


def populate(data_dir: Path) -> int:
    from django.utils import timezone

    from sessions import journal
    from sessions.models import Agent, AgentMemory, Checkpoint, Workspace

    ws = Workspace.objects.create(name="bench")
    now = timezone.now()
    total = 0
    for n in range(AGENTS):
        agent = Agent.objects.create(workspace=ws, spec={"model": "demo", "checkpoint": True},
                                     sandbox_id=f"sb{n:02d}")
        for start in range(0, FACTS, 100):
            journal.append_many(agent.id, C.facts(start, 100))
        AgentMemory.objects.create(agent=agent, key="plan", value={"step": n})
        folder = data_dir / "checkpoints" / agent.id
        folder.mkdir(parents=True)
        for turn in range(97, 101):
            path = folder / f"sb{n:02d}-t{turn}-{turn * 7}.tar.zst"
            live = turn > 100 - KEEP
            if live:
                blob = home_tar_zst(n * 1000 + turn)
                path.write_bytes(blob)
                total += len(blob)
            Checkpoint.objects.create(agent=agent, sandbox_id=f"sb{n:02d}", turn=turn,
                                      through_seq=turn * 7, path=str(path),
                                      bytes=path.stat().st_size if live else 0,
                                      expires_at=now + timedelta(days=30),
                                      deleted_at=None if live else now)
    return total


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def cp_a(src: Path, dest: Path) -> float:
    t0 = C.now()
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    subprocess.run(["sync", "-f", str(dest)], check=False)
    return C.now() - t0


def timed_restore(bundle: Path, dst: Path) -> float:
    """restore_bundle into the empty dir `dst`; its seconds."""
    from sessions.backup import restore_bundle

    t0 = C.now()
    done = restore_bundle(bundle, images=False, data_dir=dst,
                          database={"ENGINE": "django.db.backends.sqlite3",
                                    "NAME": str(dst / "alineo.sqlite3")})
    secs = C.now() - t0
    assert done.rewritten == AGENTS * KEEP and done.marked_deleted == 0, done
    return secs


def repeat(work: Path, data_dir: Path, reps: int) -> tuple[dict[str, list[float]], Path]:
    """Backup and restore, each with its cp -a, `reps` times. Returns the
    seconds per side and the last bundle (kept for its size)."""
    from sessions.backup import write_bundle

    times: dict[str, list[float]] = {"backup": [], "restore": [], "cp data": [], "cp bundle": []}
    for i in range(reps):
        t0 = C.now()
        bundle = write_bundle(work / "backups", images=False, data_dir=data_dir)
        times["backup"].append(C.now() - t0)
        times["cp data"].append(cp_a(data_dir, work / f"cp-data-{i}"))
        shutil.rmtree(work / f"cp-data-{i}")
        dst = work / f"restored-{i}"
        dst.mkdir()
        times["restore"].append(timed_restore(bundle, dst))
        times["cp bundle"].append(cp_a(bundle, work / f"cp-bundle-{i}"))
        shutil.rmtree(work / f"cp-bundle-{i}")
        shutil.rmtree(dst)
        if i < reps - 1:
            shutil.rmtree(bundle)
    return times, bundle


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    reps = 1 if args.quick else 5
    work = C.make_data_dir("backup")
    data_dir = work / "data"
    data_dir.mkdir()
    try:
        C.setup_django(data_dir)
        from django.db import connections

        cp_bytes = populate(data_dir)
        connections.close_all()
        times, bundle = repeat(work, data_dir, reps)
        rows = bundle_rows(times, bundle, cp_bytes, reps) + image_row(work)
    finally:
        C.cleanup(work)
    C.emit(rows, args)
    return 0


def bundle_rows(times: dict[str, list[float]], bundle: Path, cp_bytes: int, reps: int) -> list[dict]:
    b, r = C.median(times["backup"]), C.median(times["restore"])
    cp_b, cp_r = C.median(times["cp data"]), C.median(times["cp bundle"])
    size = du_mb(bundle)
    return [
        C.row(f"backup: {AGENTS} agents, {AGENTS * KEEP} checkpoints", b, cp_b,
              b / cp_b, "< 10 s", b < 10, "s",
              f"online, hashed, fsynced; baseline = cp -a of the data dir; {reps} rep(s)"),
        C.row(f"restore: {AGENTS} agents (verify + stage + swap)", r, cp_r,
              r / cp_r, "< 10 s", r < 10, "s", "baseline = cp -a of the bundle"),
        C.row("backup bundle size", size, cp_bytes / 1e6, size / (cp_bytes / 1e6), "info", "info", "MB",
              f"baseline = the live checkpoint files alone; database {du_mb(bundle / 'database'):.1f} MB"),
    ]


def image_row(work: Path) -> list[dict]:
    from sandboxes.backends import docker_engine_answers

    if not docker_engine_answers():
        return [C.row("backup images: docker save", "skipped", "-", None, "-", "info",
                      note="no Docker engine answers")]
    from sandboxes.images import docker_client, base_image_tag, image_present

    client = docker_client()
    try:
        tag = base_image_tag()
        if not image_present(client, tag):
            return [C.row("backup images: docker save", "skipped", "-", None, "-", "info",
                          note=f"{tag} not built")]
    finally:
        client.close()
    from sessions.backup.write import save_images

    note: list[str] = []
    tmp = work / "images"
    tmp.mkdir()
    t0 = C.now()
    saved = save_images([tag], tmp, work / "none", note, lambda m: None)
    secs = C.now() - t0
    mb = sum(i["bytes"] for i in saved) / 1e6
    return [C.row("backup images: docker save of the base image", secs, "-", None, "info", "info", "s",
                  f"{mb:.0f} MB; unchanged images are hardlinked from the previous bundle")]


if __name__ == "__main__":
    sys.exit(main())
