"""Prepared trees (issue 17): a turn checkpoint already extracted on the host,
kept read-only, that a restored or forked sandbox's home is laid over
(copy-on-write: sandboxes/backends/docker_trees.py). A restore or a fork from
a prepared checkpoint then creates no file at all; on this machine's disk,
creating the 30,000 files of a home costs 1–9 s whatever the extraction does
(docs/PERFORMANCE.md, "the floor is the disk's state").

Layout under ``<data dir>/trees/`` (``0700``, this control plane's)::

    <key>/root     the extracted home (never written again)
    <key>/source   the checkpoint's path (what the sweep checks)
    <key>/lock     flock: shared while a home is laid over it, exclusive to remove it
    .tmp-…         a tree being extracted (renamed to <key> once complete)

``<key>`` names the checkpoint file as it is (its path, size, mtime and
inode): a checkpoint is written once (a temp file renamed into place,
sandboxes/archive.py), so a key never names two contents.

Why it stays safe: the tree is extracted by the same checked stream as any
restore (every entry passes sandboxes/tar_rules.py and the restore caps
before GNU tar sees it, sandboxes/backends/overlay.py ``tar_in``) into a
directory made here; nothing of a sandbox ever writes into it (a home laid
over it writes into its own upper layer), and it is removed only when no
home uses it (:func:`sweep`).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from sandboxes import config
from sandboxes.backends import overlay
from sandboxes.safe_tar import iter_chunks

log = logging.getLogger(__name__)

TMP = ".tmp-"
TRASH = ".trash-"
#: Who owns a tree's files: the tar's owners, or root (:func:`key_for`).
KEEP, ROOT = "keep", "root"
#: The key prefix of an image's home (:func:`prepare_seed`).
SEED = "seed-"
#: A ``.tmp-`` tree older than this (seconds) belongs to a process that died.
STALE_TMP_S = 600


@dataclass(frozen=True)
class Tree:
    """A prepared tree: ``root`` is the home as of the checkpoint."""

    key: str
    path: Path

    @property
    def root(self) -> Path:
        return self.path / "root"


def top() -> Path:
    path = config.data_dir().trees
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def key_for(checkpoint: str | os.PathLike, owners: str = KEEP) -> str:
    """The key of a checkpoint file as it is now (FileNotFoundError when gone),
    extracted with ``owners``: :data:`KEEP` (the tar's, by number: the docker
    backend's) or :data:`ROOT` (every file root's: the local backend maps them
    to each sandbox's own uid, sandboxes/backends/idmap.py)."""
    if owners not in (KEEP, ROOT):
        raise ValueError(f"owners must be {KEEP!r} or {ROOT!r}, not {owners!r}")
    real = os.path.realpath(checkpoint)
    return _key(real, os.stat(real), owners)


def _key(real: str, st: os.stat_result, owners: str) -> str:
    ident = f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{owners}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def is_key(value) -> bool:
    """A checkpoint tree's key (what :func:`key_for` makes)."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def find(checkpoint: str | os.PathLike, owners: str = KEEP) -> Tree | None:
    """The prepared tree of ``checkpoint`` (with ``owners``), or None."""
    try:
        key = key_for(checkpoint, owners)
    except OSError:
        return None
    path = top() / key
    return Tree(key, path) if _complete(path) else None


def _complete(path: Path) -> bool:
    return not path.is_symlink() and (path / "root").is_dir() and (path / "source").is_file()


def prepare(checkpoint: str | os.PathLike, owners: str = KEEP) -> Tree:
    """The prepared tree of ``checkpoint``, extracted now when there is none
    (UnsafeArchive, ExecFailed, … when it cannot be: nothing is left)."""
    import zstandard

    found = find(checkpoint, owners)
    if found is not None:
        return found
    real = os.path.realpath(checkpoint)
    with open(real, "rb") as fh:
        key = _key(real, os.fstat(fh.fileno()), owners)  # the file read, whatever the path holds now
        reader = zstandard.ZstdDecompressor().stream_reader(fh)
        return _extract(key, iter_chunks(reader), real, owners)


def prepare_seed(tar: bytes) -> Tree:
    """A tree of an image's home (a home tar, sandboxes/backends/hosthome.py
    ``image_home_tar``): the lowest layer under a checkpoint's, so that a home
    laid over both is what a restore into a fresh container gives."""
    key = SEED + hashlib.sha256(tar).hexdigest()[:32]
    path = top() / key
    if _complete(path):
        return Tree(key, path)
    return _extract(key, [tar], SEED, KEEP)


def _extract(key: str, chunks: Iterable[bytes], source: str, owners: str) -> Tree:
    work = top() / f"{TMP}{key}-{uuid.uuid4().hex[:8]}"
    work.mkdir(mode=0o700)
    try:
        (work / "root").mkdir(mode=0o700)
        fd = os.open(work / "root", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        overlay.tar_in(f"tree {key[:12]}", fd, chunks, config.restore_caps(),
                       same_owner=owners == KEEP)
        (work / "source").write_text(f"{owners}\n{source}")
        (work / "lock").touch(mode=0o600)
        try:
            os.rename(work, top() / key)
        except OSError:  # another process prepared it meanwhile
            _rmtree(work)
    except BaseException:
        _rmtree(work)
        raise
    return Tree(key, top() / key)


@contextmanager
def using(tree: Tree) -> Iterator[bool]:
    """Hold ``tree`` (a shared lock) while a home is laid over it; yields
    False when it was removed meanwhile (then it must not be used)."""
    try:
        fd = os.open(tree.path / "lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield _complete(tree.path) and _same_file(fd, tree.path / "lock")
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """The lock held is still the tree's (not one swept and prepared again)."""
    try:
        st, now = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def sweep(in_use: Callable[[], set[str]], owners: str = KEEP, *,
          now: float | None = None) -> list[str]:
    """Remove the trees of ``owners`` (one backend's kind: another backend's
    homes are not in its ``in_use``) no home uses (``in_use()``: the keys
    the homes that exist are laid over) whose checkpoint is gone or is not
    its agent's newest, and the image homes no home uses; and what a dead
    process left. Returns the keys removed."""
    now = time.time() if now is None else now
    root = top()
    candidates, held = [], []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((TMP, TRASH)):
            if entry.name.startswith(TRASH) or now - _mtime(entry, now) > STALE_TMP_S:
                _rmtree(entry)
            continue
        source = _source(entry) if _complete(entry) else None
        if source is not None and source[0] == owners and not _wanted(entry, *source):
            candidates.append(entry)
    try:
        for entry in candidates:
            fd = _lock_exclusive(entry)
            if fd is not None:
                held.append((entry, fd))
        used = in_use() if held else set()
        gone = []
        for entry, _ in held:
            if entry.name not in used:
                aside = root / f"{TRASH}{entry.name}-{uuid.uuid4().hex[:8]}"
                os.rename(entry, aside)
                _rmtree(aside)
                gone.append(entry.name)
    finally:
        for _, fd in held:
            os.close(fd)
    if gone:
        log.info("removed %d prepared tree(s) no home uses", len(gone))
    return gone


def _mtime(entry: Path, default: float) -> float:
    try:
        return entry.lstat().st_mtime
    except OSError:
        return default


def _source(entry: Path) -> tuple[str, str] | None:
    """(owners, the checkpoint's path or SEED) a tree was made from."""
    try:
        owners, _, text = (entry / "source").read_text().partition("\n")
    except OSError:
        return None
    return owners, text


def _wanted(entry: Path, owners: str, text: str) -> bool:
    """A tree of its agent's newest checkpoint, while that file is as it was
    (an image's home: only while a home uses it; made again in an instant)."""
    if text == SEED:
        return False
    source = Path(text)
    try:
        if key_for(source, owners) != entry.name:
            return False
    except (OSError, ValueError):  # gone, or not a source this release wrote
        return False
    return source == newest_checkpoint(source.parent)


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint file in an agent's checkpoint folder."""
    best, best_t = None, -1
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    for e in entries:
        if e.name.endswith(".tar.zst") and not e.name.startswith(".") and e.is_file(follow_symlinks=False):
            t = e.stat(follow_symlinks=False).st_mtime_ns
            if t > best_t:
                best, best_t = Path(e.path), t
    return best


def _lock_exclusive(entry: Path) -> int | None:
    try:
        fd = os.open(entry / "lock", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --- in the background, after a checkpoint ----------------------------------------------


class Preparer:
    """One thread that prepares the trees of new checkpoints, at the lowest
    CPU priority, newest first per agent (a checkpoint superseded before its
    turn came is skipped), then sweeps the trees that are no longer wanted."""

    def __init__(self, in_use: Callable[[], set[str]], owners: str = KEEP):
        self._in_use = in_use
        self._owners = owners
        self._todo: queue.Queue[Path | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.done: list[str] = []  # keys prepared (the tests read it)

    def submit(self, checkpoint: str | os.PathLike) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tree-preparer", daemon=True)
                self._thread.start()
        self._todo.put(Path(checkpoint))

    def drain(self, timeout: float = 120) -> None:
        """Wait until every submitted checkpoint was handled (tests, benches)."""
        deadline = time.monotonic() + timeout
        while self._todo.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # tar inherits it
        except OSError:
            pass
        _idle_io()
        while True:
            checkpoint = self._todo.get()
            try:
                self._one(checkpoint)
            except Exception as exc:  # noqa: BLE001 - a restore then extracts, as before
                log.warning("preparing the tree of %s failed: %s", checkpoint, exc)
            finally:
                self._todo.task_done()

    def _one(self, checkpoint: Path) -> None:
        if newest_checkpoint(checkpoint.parent) != checkpoint:
            return  # superseded (or rotated away) before its turn came
        short = room_short(checkpoint)
        if short:
            log.warning("not preparing the tree of %s: %s", checkpoint, short)
        else:
            tree = prepare(checkpoint, self._owners)
            self.done = [*self.done[-99:], tree.key]
        sweep(self._in_use, self._owners)


#: A tree is not prepared when the data dir's disk would keep less than this
#: share free, or less than :data:`MIN_FREE` bytes (a tree is a copy of a
#: home: it must never be what fills the disk the journal writes to).
MIN_FREE_SHARE, MIN_FREE = 0.10, 1 << 30
#: How much larger than its zstd checkpoint a home is assumed to be.
EXPANSION = 8


def room_short(checkpoint: Path) -> str | None:
    """Why there is no room for the tree of ``checkpoint``, or None."""
    try:
        usage = shutil.disk_usage(top())
        need = os.stat(checkpoint).st_size * EXPANSION
    except OSError as exc:
        return str(exc)
    left = usage.free - need
    if left < max(MIN_FREE, usage.total * MIN_FREE_SHARE):
        return (f"the disk would keep {left >> 20} MiB free of {usage.total >> 20} MiB "
                f"(at least {max(MIN_FREE, int(usage.total * MIN_FREE_SHARE)) >> 20} MiB are kept)")
    return None


def _idle_io() -> None:
    """The idle I/O class for this thread and the tar it starts (best effort:
    only some I/O schedulers honour it; nice 19 is the other half)."""
    import ctypes
    import platform

    number = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
    if number is None:
        return
    ioprio_class_idle, ioprio_who_process = 3, 1
    try:
        ctypes.CDLL(None, use_errno=True).syscall(number, ioprio_who_process, threading.get_native_id(),
                                                   ioprio_class_idle << 13)
    except (OSError, AttributeError):
        pass


def referenced(labels: Iterable[dict], label: str) -> set[str]:
    """The tree keys named by ``label`` in these label maps."""
    return {str(m[label]) for m in labels if m and m.get(label)}
