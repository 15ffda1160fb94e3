"""The docker backend's host-dir homes (issue 17): a restored or forked
agent's home is a directory on the host, ``<data dir>/homes/<agent id>``,
that its container bind-mounts at ``/root``. The checkpoint is extracted
there by GNU tar on the host (the checked stream, sandboxes/backends/
overlay.py ``tar_in``) while the container is created and started — at the
disk's speed, with no trip through the engine and no write into an overlay
layer. The bridge waits for :data:`READY` in its run dir before it reads its
session file (``--wait-home``), which :func:`seal` writes once the home is
complete.

Why it stays safe:

* the directory is made here, empty, ``0700``, under ``homes/`` (``0700``,
  owned by this control plane); it is opened ``O_NOFOLLOW`` and tar works in
  that fd; every entry passes sandboxes/tar_rules.py (and the restore caps)
  before tar sees a byte of it;
* it is written from the host only while it is *unsealed*: created by this
  process, and nothing of the sandbox has run yet (its bridge waits for
  :data:`READY`). After the seal (or in another process) every write goes
  through the engine (``put_archive``, inside the container's mounts);
* ``docker commit`` never includes a bind mount, so a snapshot of such a
  container cannot carry an agent's home (and setup snapshots are built in
  containers that have none);
* the container is the same as any other: caps dropped, no new privileges,
  network none; uid 0 inside is uid 0 on the host (no user-namespace remap,
  checked), so the owners tar restores by number are the ones the sandbox
  user had.

The home goes when its container is removed (DockerBackend.remove), when
the agent gets a new one (:func:`fresh`), and, orphaned by a container that
vanished (``docker rm -f``), at the next sweep (:func:`sweep`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable

from sandboxes import config
from sandboxes.bridge.protocol import HOME_READY

log = logging.getLogger(__name__)

#: The file in the run dir that tells a waiting bridge its home is complete.
READY = HOME_READY
#: A home no container mounts is removed by a sweep once it is this old
#: (seconds): younger ones may belong to a restore that is still creating.
ORPHAN_AGE_S = 600
#: Homes set aside by :func:`fresh` while they are removed.
TRASH = ".trash-"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def root() -> Path:
    return config.data_dir().homes


def path_for(agent_id: str) -> Path:
    if not _SAFE_ID.match(str(agent_id)):
        raise ValueError(f"agent id {agent_id!r} cannot name a home directory")
    return root() / str(agent_id)


def fresh(agent_id: str) -> Path:
    """An empty home for ``agent_id``. An older one (its container is gone:
    ``docker rm -f``, a lost sandbox) is renamed aside and removed on a thread
    of its own: a restore does not wait for 5,000 files to be deleted."""
    top = root()
    top.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(top, 0o700)
    home = path_for(agent_id)
    if owned(home) is not None:
        aside = top / f"{TRASH}{home.name}-{uuid.uuid4().hex[:8]}"
        os.rename(home, aside)
        _remove_aside(aside)
    elif home.is_symlink():
        home.unlink()
    home.mkdir(mode=0o700)
    return home


def _remove_aside(aside: Path) -> None:
    """Remove a home set aside, in the background, at a low priority: a
    ``rm -rf`` of its own (no GIL: the restore beside it checks every tar
    header in Python, docs/PERFORMANCE.md), waited for on a thread; in this
    process if ``rm`` cannot be started."""
    argv = ["rm", "-rf", "--one-file-system", "--", str(aside)]
    if shutil.which("nice"):
        argv = ["nice", "-n", "19", *argv]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        threading.Thread(target=rmtree, args=(aside,), name="home-trash", daemon=True).start()
        return
    threading.Thread(target=proc.wait, name="home-trash", daemon=True).start()


def owned(path: str | os.PathLike | None) -> Path | None:
    """``path`` when it is one of ours (directly under :func:`root`, a real
    directory), else None: what a container's mount says is checked before
    anything is opened or removed through it."""
    if not path:
        return None
    p = Path(os.path.abspath(path))
    top = root()
    if p.parent != top or not _SAFE_ID.match(p.name):
        return None
    try:
        if p.is_symlink() or not p.is_dir() or top.is_symlink():
            return None
    except OSError:
        return None
    return p


def of_mounts(mounts: Iterable[dict], home: str) -> Path | None:
    """The host-dir home among a container's mounts (its ``Mounts`` in an
    inspect or a list row), or None."""
    for m in mounts or ():
        if m.get("Type") == "bind" and (m.get("Destination") or "").rstrip("/") == home:
            return owned(m.get("Source"))
    return None


def open_dir(path: Path) -> int:
    """An ``O_NOFOLLOW`` directory fd on ``path`` (tar works in the fd, never
    in a path it resolves again)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def seal(run_dir: str | os.PathLike) -> None:
    """Tell the waiting bridge its home is complete."""
    marker = Path(run_dir) / READY
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    os.close(fd)


def remove(path: Path | None) -> None:
    """Remove a home (fd-based: a link inside is removed, never followed)."""
    p = owned(path) if path is not None else None
    if p is not None:
        rmtree(p)


def rmtree(path: Path) -> None:
    """Remove a tree a sandbox wrote (fd-based: a link inside is removed, never
    followed), also where it left directories it made unwritable."""
    def onerror(func, name, exc_info):  # a sandbox may leave dirs it made unwritable
        try:
            os.chmod(os.path.dirname(name), 0o700)
            func(name)
        except OSError:
            pass
    shutil.rmtree(path, onerror=onerror)


def sweep(in_use: Iterable[Path], *, now: float | None = None) -> list[str]:
    """Remove the homes no container mounts (their container was removed
    behind our back) once they are :data:`ORPHAN_AGE_S` old; returns their names."""
    top = root()
    if not top.is_dir():
        return []
    keep = {Path(p).name for p in in_use}
    now = time.time() if now is None else now
    gone = []
    for entry in top.iterdir():
        if entry.name.startswith(TRASH) and not entry.is_symlink():
            rmtree(entry)  # set aside by fresh(), its thread died with its process
            continue
        if entry.name in keep or owned(entry) is None:
            continue
        try:
            # ctime, not mtime: tar gives the home the checkpoint's own mtime
            # (an old one), but setting it moves ctime to the time of the restore.
            if now - entry.lstat().st_ctime < ORPHAN_AGE_S:
                continue
        except FileNotFoundError:
            continue
        remove(entry)
        gone.append(entry.name)
    if gone:
        log.info("removed %d orphaned host home(s): %s", len(gone), ", ".join(gone))
    return gone


#: The most of an image's home kept in memory to seed host homes with.
IMAGE_HOME_MAX = 16 << 20


def image_home_tar(stream: Iterable[bytes]) -> bytes | None:
    """The engine's archive of an image's home (entries ``root``, ``root/…``)
    as a home tar (``.``, ``./…``), or None when it holds anything but
    regular files and directories, or more than :data:`IMAGE_HOME_MAX`: what
    is on disk before a checkpoint is extracted over it is then only what a
    checkpoint's own entries replace (never a link tar would follow)."""
    import io
    import tarfile

    raw, size = [], 0
    for chunk in stream:
        size += len(chunk)
        if size > IMAGE_HOME_MAX + (1 << 20):
            return None
        raw.append(chunk)
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(b"".join(raw)), mode="r:") as src, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            if not (member.isreg() or member.isdir()):
                return None
            _, _, rest = member.name.partition("/")
            member.name = f"./{rest}" if rest else "."
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    return out.getvalue()

