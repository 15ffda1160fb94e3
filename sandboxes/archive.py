"""Home-dir archives, on the host: packing (tar + zstd), turn checkpoint
files (store, restore, rotate), and reading the bridge's session file out of
a checkpoint.

Extraction of what a sandbox produced is never trusted: it goes through
sandboxes/safe_tar.py (the backends' ``write_home``).

* :func:`pack_home` / :func:`unpack_home` — a sandbox's home as zstd bytes.
* Turn checkpoint files: :func:`store_checkpoint` (streamed to
  ``<data dir>/checkpoints/<agent>/<sandbox>-turn-<n>.tar.zst``, atomically),
  :func:`restore_checkpoint`, and rotation (:func:`rotate` for paths,
  :func:`rotate_rows` for the rows a caller keeps about them). The rows and
  the ``agent.checkpointed`` fact are the worker's (sessions/worker/checkpoints.py).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
import time
import uuid
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from sandboxes import config
from sandboxes.errors import SandboxError
from sandboxes.safe_tar import as_fileobj, iter_chunks

log = logging.getLogger(__name__)

ZSTD_LEVEL = 1  # 1-3 measured; 1 keeps a 50 MB home under 0.5 s
#: Where the bridge keeps its session file, relative to the home.
SESSION_MEMBER = ".alineo/session.json"


# --- packing -------------------------------------------------------------------------
def pack_home(backend, sandbox_id: str, *, level: int = ZSTD_LEVEL) -> bytes:
    """The sandbox's home as zstd-compressed tar bytes (package caches excluded).
    Compression runs on the host: images carry no zstd."""
    import zstandard

    out = io.BytesIO()
    cctx = zstandard.ZstdCompressor(level=level, threads=-1)
    with cctx.stream_writer(out, closefd=False) as writer:
        for chunk in backend.read_home(sandbox_id):
            writer.write(chunk)
    return out.getvalue()


def unpack_home(backend, sandbox_id: str, data) -> None:
    """Write zstd-compressed tar (bytes, a path or a binary file) into the home
    dir; the backend refuses unsafe entries."""
    import zstandard

    if isinstance(data, (str, Path)):
        with open(data, "rb") as fh:
            return unpack_home(backend, sandbox_id, fh)
    reader = zstandard.ZstdDecompressor().stream_reader(as_fileobj(data), closefd=False)
    backend.write_home(sandbox_id, iter_chunks(reader))


# --- turn checkpoints: store, restore, rotate ------------------------------------------
#: Newest turn checkpoints kept per sandbox unless a workspace says otherwise.
KEEP_CHECKPOINTS = 3
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_TURN_NAME = re.compile(r"-turn-(\d+)\.tar\.zst$")


class StoredCheckpoint(NamedTuple):
    path: Path
    bytes: int
    ms: int


def checkpoints_root(root: str | os.PathLike | None = None) -> Path:
    return config.data_dir().checkpoints if root is None else Path(root)


def checkpoint_path(agent_id: str, sandbox_id: str, turn: int, *,
                    root: str | os.PathLike | None = None) -> Path:
    """``<root>/<agent_id>/<sandbox_id>-turn-<turn>.tar.zst`` (root defaults to
    ``DATA_DIR/checkpoints``). Ids that could leave the folder are refused."""
    for what, value in (("agent id", agent_id), ("sandbox id", sandbox_id)):
        if not isinstance(value, str) or not _SAFE_ID.match(value):
            raise ValueError(f"{what} {value!r} cannot name a checkpoint file")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise ValueError(f"turn must be a non-negative integer, not {turn!r}")
    return checkpoints_root(root) / agent_id / f"{sandbox_id}-turn-{turn}.tar.zst"


def turn_of(path: str | os.PathLike) -> int | None:
    """The turn number in a checkpoint file's name, or None."""
    m = _TURN_NAME.search(os.fspath(path))
    return int(m.group(1)) if m else None


class HomeTooLarge(SandboxError):
    """A home past ALINEO_RESTORE_MAX_BYTES: a checkpoint of it could never be
    restored (sandboxes/safe_tar.py refuses it), so none is taken."""

    permanent_default = True


def _capped(chunks: Iterable[bytes], sandbox_id: str) -> Iterable[bytes]:
    """The tar stream of a home, stopped once it passes the restore cap — a
    sandbox's sparse 1 TB file must not cost the host a 1 TB read and compress."""
    max_bytes, _ = config.restore_caps()
    total = 0
    try:
        for chunk in chunks:
            total += len(chunk)
            if total > max_bytes:
                raise HomeTooLarge(
                    f"the home of {sandbox_id} is over ALINEO_RESTORE_MAX_BYTES ({max_bytes} "
                    "bytes) as a tar: no checkpoint taken (one that large could not be restored)")
            yield chunk
    finally:
        getattr(chunks, "close", lambda: None)()  # stops the tar (read_home's finally)


def store_checkpoint(backend, sandbox_id: str, agent_id: str, turn: int, *,
                     root: str | os.PathLike | None = None, level: int = ZSTD_LEVEL,
                     stem: str | None = None) -> StoredCheckpoint:
    """Take a turn checkpoint: the home as tar (package caches excluded, by
    exec'd tar), compressed with zstd on the host while it streams, written to
    a temp file, fsynced, renamed into place. Returns (path, bytes, ms). On any
    failure nothing is left behind and the error propagates (the caller
    journals ``agent.checkpoint_failed``: never a success). ``stem`` names the
    file instead of the sandbox id (a checkpoint on request has its own)."""
    import zstandard

    t0 = time.monotonic()
    path = checkpoint_path(agent_id, stem or sandbox_id, turn, root=root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            cctx = zstandard.ZstdCompressor(level=level, threads=-1)
            with cctx.stream_writer(fh, closefd=False) as writer:
                for chunk in _capped(backend.read_home(sandbox_id), sandbox_id):
                    writer.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
            size = fh.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return StoredCheckpoint(path, size, int(round((time.monotonic() - t0) * 1000)))


def restore_checkpoint(backend, sandbox_id: str, path: str | os.PathLike) -> int:
    """Extract a turn checkpoint into the sandbox's home (created or running).
    Unsafe entries are refused (UnsafeArchive) before anything they name is
    written. Returns the milliseconds it took."""
    t0 = time.monotonic()
    unpack_home(backend, sandbox_id, Path(path))
    return int(round((time.monotonic() - t0) * 1000))


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory; best effort for directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rotate(paths: Iterable[str | os.PathLike], keep: int = KEEP_CHECKPOINTS) -> list[Path]:
    """Delete the checkpoint files of one sandbox beyond the newest ``keep``.
    Newest = highest turn in the name (``-turn-<n>``), then newest mtime.
    Returns the paths deleted (or already gone), oldest first."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be a non-negative integer, not {keep!r}")
    items = []
    for p in dict.fromkeys(Path(p) for p in paths):
        try:
            mtime = p.stat().st_mtime
        except FileNotFoundError:
            mtime = float("-inf")
        turn = turn_of(p)
        items.append(((-1 if turn is None else turn), mtime, str(p), p))
    items.sort(reverse=True)
    doomed = [p for *_, p in items[keep:]]
    for p in doomed:
        p.unlink(missing_ok=True)
    return list(reversed(doomed))


def rotate_rows(rows: Sequence, keep: int = KEEP_CHECKPOINTS) -> list:
    """Given the Checkpoint rows of ONE sandbox (any objects with ``turn``,
    ``path``, ``deleted_at`` and ``pk``/``id``; ``created_at`` optional), delete
    the files of the rows beyond the newest ``keep`` live ones and return those
    rows (oldest first) for the caller to mark ``deleted_at``. Rows already
    marked deleted are neither counted nor returned."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be a non-negative integer, not {keep!r}")
    live = [r for r in rows if getattr(r, "deleted_at", None) is None]

    def order(r):
        created = getattr(r, "created_at", None)
        return (r.turn, created.timestamp() if created is not None else 0.0,
                getattr(r, "pk", None) or getattr(r, "id", 0) or 0)

    live.sort(key=order, reverse=True)
    doomed = live[keep:]
    for r in doomed:
        if r.path:
            Path(r.path).unlink(missing_ok=True)
    return list(reversed(doomed))


# --- the bridge's session file inside a checkpoint ---------------------------------------


#: The largest session file read back from a checkpoint (it came from the sandbox).
MAX_SESSION_BYTES = 256 << 20


class CheckpointUnreadable(SandboxError):
    """The checkpoint file is not a zstd tar this control plane can read."""

    permanent_default = True


def session_in(path: str | os.PathLike) -> dict | None:
    """The bridge's session file inside a checkpoint (zstd tar), or None when
    there is none or it is not one a bridge wrote: the checkpoint came from
    inside a sandbox, so the member is read streaming, no larger than
    :data:`MAX_SESSION_BYTES`, and the fields the control plane uses are
    checked (:func:`usable_session`). Raises CheckpointUnreadable when the
    file itself cannot be read."""
    import zstandard

    try:
        with open(path, "rb") as fh:
            reader = zstandard.ZstdDecompressor().stream_reader(fh)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    if name == SESSION_MEMBER and member.isfile():
                        return _read_session(tar, member, path)
    except (OSError, tarfile.TarError, zstandard.ZstdError) as exc:
        raise CheckpointUnreadable(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:  # the member is not JSON
        log.warning("the session file in %s is not JSON: %s", path, exc)
    return None


def _read_session(tar: tarfile.TarFile, member: tarfile.TarInfo, path) -> dict | None:
    if member.size > MAX_SESSION_BYTES:
        log.warning("the session file in %s is %d bytes: not read", path, member.size)
        return None
    session = json.loads(tar.extractfile(member).read(MAX_SESSION_BYTES + 1))
    if not usable_session(session):
        log.warning("the session file in %s is not one a bridge wrote", path)
        return None
    return session


def usable_session(session) -> bool:
    """The fields a restore relies on are what a bridge writes (docs/BRIDGE.md)."""
    if not isinstance(session, dict):
        return False
    sid, current = session.get("session_id"), session.get("current")
    counters = [session.get(k) for k in ("bseq", "turns")]
    return (isinstance(sid, str) and 0 < len(sid) <= 1024
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counters)
            and (current is None or (isinstance(current, dict)
                                     and isinstance(current.get("turn"), int)
                                     and not isinstance(current.get("turn"), bool))))


def session_file_tar(session: dict) -> bytes:
    """A tar holding only the session file (and its directory), for write_home."""
    payload = json.dumps(session).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        d = tarfile.TarInfo("./" + SESSION_MEMBER.rpartition("/")[0])
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o700, int(time.time())
        tar.addfile(d)
        ti = tarfile.TarInfo(f"./{SESSION_MEMBER}")
        ti.size, ti.mode, ti.mtime = len(payload), 0o600, int(time.time())
        tar.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()
