"""Restoring a bundle: ``restore_bundle(path)`` (``manage.py restore --from DIR``).

Order, so that a refusal or a failure changes nothing in the data dir:

1. verify the whole bundle (sessions.backup.verify) — refused bundles stop here;
2. check the target: a data dir holding data (anything but a fresh
   ``secret_key``, ``locks/`` and empty folders) or a non-empty PostgreSQL
   database is refused unless ``force``;
3. stage everything inside the data dir (``.restore-*``, same file system):
   the database copy with every Checkpoint.path rewritten to this data dir
   (rows whose file was not in the bundle are marked deleted, so nothing
   points at a file that is not there), the checkpoint files, inputs and the
   secret key — each re-hashed while copied and compared with the manifest;
4. ``docker load`` the images (additive; an image already present with the
   same id is skipped);
5. only now: with ``force``, move the old contents aside (a sibling
   ``<data dir>.before-restore-<time>``, else a folder inside), then rename
   the staged files into place.

The server must not be running on the target data dir. When it starts, the
agents' old sandboxes do not exist here; the restore ladder (sessions.worker.ladder)
brings each back from its newest checkpoint, else rebuilds it from the transcript.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.utils import timezone as djtz

from sandboxes.backends import docker_engine_answers
from sessions.backup import credentials
from sessions.backup.format import BackupError, BundleRefused, fsync_path
from sessions.backup.verify import verify_bundle
from sessions.backup.write import (
    copy_hashing,
    database_settings,
    engine_of,
    pg_env_argv,
    sqlite_path,
)
from sessions.models import Agent, AgentLease, Checkpoint

Log = Callable[[str], None]
#: What a data dir may hold and still count as empty: settings.py makes the
#: secret key on first import, setup locks are made on demand.
IGNORED = {"secret_key", "locks"}
STAGING_PREFIX = ".restore-"


@dataclass
class Restored:
    bundle: Path
    data_dir: Path
    moved_aside: list[str] = field(default_factory=list)
    files: int = 0
    rewritten: int = 0
    marked_deleted: int = 0
    images: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _has_content(path: Path) -> bool:
    if path.is_dir() and not path.is_symlink():
        return any(_has_content(p) for p in path.iterdir())
    return True


def data_dir_contents(data_dir: Path, db_file: Path | None) -> list[str]:
    """What in the target counts as data (empty list: safe to restore into)."""
    found = []
    if data_dir.is_dir():
        for entry in sorted(data_dir.iterdir()):
            if entry.name in IGNORED or entry.name.startswith(STAGING_PREFIX):
                continue
            if _has_content(entry):
                found.append(entry.name)
    if db_file is not None and db_file.exists() and not db_file.is_relative_to(data_dir):
        found.append(str(db_file))
    return found


def _pg_has_data() -> bool:
    """A PostgreSQL target holds data: any agent or user (an unmigrated or
    freshly migrated database does not)."""


    tables = connection.introspection.table_names()
    if Agent._meta.db_table not in tables:
        return bool([t for t in tables if not t.startswith("django_")])
    return Agent.objects.exists() or get_user_model().objects.exists()


def _rewrite_checkpoints(db: Path, manifest: dict, data_dir: Path) -> tuple[int, int]:
    """Point Checkpoint rows of the staged SQLite copy at this data dir; mark rows
    whose file is not in the bundle deleted. Returns (rewritten, marked deleted)."""

    table = Checkpoint._meta.db_table
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    conn = sqlite3.connect(db)
    try:
        rewritten = marked = 0
        with conn:
            for entry in manifest["files"]:
                if entry.get("source"):
                    new = str(data_dir / entry["path"][len("data/"):])
                    cur = conn.execute(f"UPDATE {table} SET path = ? WHERE path = ?",
                                       (new, entry["source"]))
                    rewritten += cur.rowcount
            kept = {str(data_dir / e["path"][len("data/"):]) for e in manifest["files"] if e.get("source")}
            live = conn.execute(f"SELECT id, path FROM {table} WHERE deleted_at IS NULL AND path != ''").fetchall()
            for pk, path in live:
                if path not in kept:
                    conn.execute(f"UPDATE {table} SET deleted_at = ? WHERE id = ?", (now, pk))
                    marked += 1
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    return rewritten, marked


def _forget_leases(db: Path | None = None) -> None:
    """Worker leases name the old deployment's processes: drop them, so the
    first worker here takes every agent at once (not after they expire).
    ``db``: the staged SQLite copy; None: the database Django uses."""


    table = AgentLease._meta.db_table
    if db is None:
        if table in connection.introspection.table_names():  # a bundle from before leases has none
            AgentLease.objects.all().delete()
        return
    conn = sqlite3.connect(db)
    try:
        with conn:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (table,)).fetchone():
                conn.execute(f"DELETE FROM {table}")
    finally:
        conn.close()


def _rewrite_checkpoints_orm(manifest: dict, data_dir: Path) -> tuple[int, int]:


    rewritten = 0
    kept = set()
    for entry in manifest["files"]:
        if entry.get("source"):
            new = str(data_dir / entry["path"][len("data/"):])
            kept.add(new)
            rewritten += Checkpoint.objects.filter(path=entry["source"]).update(path=new)
    stale = Checkpoint.objects.filter(deleted_at__isnull=True).exclude(path="").exclude(path__in=kept)
    return rewritten, stale.update(deleted_at=djtz.now())


def load_images(bundle: Path, manifest: dict, say: Log, out: Restored) -> None:

    entries = manifest.get("images") or []
    if not entries:
        return
    if not docker_engine_answers():
        out.notes.append(f"{len(entries)} image(s) in the bundle not loaded: no Docker engine "
                         "answers here (the local backend needs none)")
        return
    import docker
    import docker.errors

    client = docker.from_env(timeout=None)
    try:
        for entry in entries:
            try:
                if client.api.inspect_image(entry["tag"])["Id"] == entry.get("id"):
                    say(f"image {entry['tag']}: already present")
                    out.images.append(entry["tag"])
                    continue
            except docker.errors.ImageNotFound:
                pass
            with open(bundle / entry["file"], "rb") as fh:
                for _ in client.api.load_image(fh):
                    pass
            try:
                client.api.inspect_image(entry["tag"])
            except docker.errors.ImageNotFound as exc:
                raise BackupError(f"docker load of {entry['file']} did not produce {entry['tag']}") from exc
            say(f"image {entry['tag']}: loaded")
            out.images.append(entry["tag"])
    finally:
        client.close()


def _move_aside(data_dir: Path, db_file: Path | None, stamp: str, out: Restored) -> None:
    """Move the old contents out of the way (never deleted)."""
    entries = [e for e in data_dir.iterdir() if not e.name.startswith(STAGING_PREFIX)]
    aside = data_dir.parent / f"{data_dir.name}.before-restore-{stamp}"
    try:
        aside.mkdir()
        probe = aside / ".probe"
        probe.touch()
        os.rename(probe, data_dir / f".probe-{stamp}")  # same file system?
        os.rename(data_dir / f".probe-{stamp}", probe)
        probe.unlink()
    except OSError as exc:
        if aside.exists():
            shutil.rmtree(aside, ignore_errors=True)
        if exc.errno not in (errno.EXDEV, errno.EACCES, errno.EPERM, errno.EROFS, errno.EBUSY):
            raise
        aside = data_dir / f"before-restore-{stamp}"
        aside.mkdir()
    for entry in entries:
        os.rename(entry, aside / entry.name)
    if db_file is not None and not db_file.is_relative_to(data_dir):
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = Path(str(db_file) + suffix)
            if p.exists():
                os.rename(p, aside / p.name)
    out.moved_aside.append(str(aside))
    fsync_path(data_dir)
    fsync_path(aside.parent)


def _check_engine(engine: str, manifest: dict) -> None:
    bundled = manifest["database"]["engine"]
    if engine != bundled:
        raise BundleRefused(
            f"the bundle holds a {bundled} database but this deployment uses "
            f"{engine} (DATABASE_URL {'set' if engine == 'postgresql' else 'unset'}): restore into "
            "the same engine, then migrate data with Django's dumpdata/loaddata if you must")


def _check_target(data_dir: Path, db_file: Path | None, engine: str,
                  force: bool) -> tuple[list[str], bool]:
    """What the target holds: (the data dir's entries that count as data, whether
    the PostgreSQL database has rows). Refused when it holds data, unless ``force``."""
    present = data_dir_contents(data_dir, db_file)
    pg_data = engine == "postgresql" and _pg_has_data()
    if (present or pg_data) and not force:
        what = ", ".join(present[:8]) + ("…" if len(present) > 8 else "")
        if pg_data:
            what = (what + ", " if what else "") + "rows in the PostgreSQL database"
        raise BackupError(
            f"the data dir {data_dir} is not empty ({what}). Stop the server and pass --force to "
            "move the current contents aside (nothing is deleted), or restore into a fresh ALINEO_DATA_DIR")
    return present, pg_data


def _stage_copy(src: Path, dest: Path, entry: dict, what: str) -> None:
    """Copy one file of the bundle, re-hashing it against its manifest entry."""
    digest, size = copy_hashing(src, dest)
    if (digest, size) != (entry["sha256"], entry["bytes"]):
        raise BundleRefused(f"{what} changed while it was restored")


def _stage(bundle: Path, manifest: dict, staging: Path, engine: str, images: bool,
           say: Log, out: Restored) -> Path | None:
    """Everything into ``staging``, nothing into the data dir yet; returns the
    staged SQLite copy (None for PostgreSQL, restored from the bundle itself)."""
    for entry in manifest["files"]:
        _stage_copy(bundle / entry["path"], staging / entry["path"], entry, f"file {entry['path']}")
        out.files += 1
    staged_db = None
    if engine == "sqlite":
        dbm = manifest["database"]
        staged_db = staging / "database.sqlite3"
        _stage_copy(bundle / dbm["file"], staged_db, dbm, f"database {dbm['file']}")
        out.rewritten, out.marked_deleted = _rewrite_checkpoints(staged_db, manifest, out.data_dir)
        _forget_leases(staged_db)
    if images:
        load_images(bundle, manifest, say, out)
    elif manifest.get("images"):
        out.notes.append(f"{len(manifest['images'])} image(s) not loaded (--no-images)")
    return staged_db


def _install_sqlite(staged_db: Path, db_file: Path) -> None:
    db_file.parent.mkdir(parents=True, exist_ok=True)
    # A -wal or -journal left beside the new file would be replayed into it.
    for suffix in ("-wal", "-shm", "-journal"):
        Path(str(db_file) + suffix).unlink(missing_ok=True)
    os.replace(staged_db, db_file)
    fsync_path(db_file.parent)


def _install_files(staging: Path, data_dir: Path) -> None:
    staged_data = staging / "data"
    if staged_data.is_dir():
        for entry in sorted(staged_data.iterdir()):
            target = data_dir / entry.name
            if target.is_dir() and entry.is_dir():
                _merge(entry, target)
            else:
                os.replace(entry, target)
    fsync_path(data_dir)


def _report(out: Restored, engine: str, manifest: dict, db_file: Path | None, say: Log) -> None:
    dbm = manifest["database"]
    say(f"restored the database ({engine}, {dbm.get('agents', '?')} agents, {dbm.get('events', '?')} "
        f"events) into {db_file or 'DATABASE_URL'}")
    say(f"restored {out.files} file(s) into {out.data_dir}; {out.rewritten} checkpoint path(s) point here"
        + (f"; {out.marked_deleted} checkpoint row(s) whose file was not in the bundle marked deleted"
           if out.marked_deleted else ""))
    left_out = credentials.note(dbm)
    if left_out:
        out.notes.append(left_out)
    for note in out.notes:
        say(f"note: {note}")
    say("start the server: each agent's sandbox from the old machine is missing here, and the "
        "restore ladder brings it back from its newest checkpoint (else rebuilds it from the transcript)")


def restore_bundle(path, *, force: bool = False, images: bool = True, data_dir=None,
                   database: dict | None = None, say: Log = lambda m: None) -> Restored:
    """Verify, then restore (see the module doc). ``data_dir`` and ``database`` (a
    Django DATABASES entry) default to the running deployment's."""

    verified = verify_bundle(path, images=images)
    bundle, manifest = verified.bundle, verified.manifest
    say(f"verified {bundle}: manifest version {manifest['version']}, "
        f"{len(verified.checked)} file(s) match their sha256, database passes its checks")
    data_dir = Path(data_dir or settings.DATA_DIR).resolve()
    db = database or database_settings()
    engine = engine_of(db)
    _check_engine(engine, manifest)
    db_file = sqlite_path(db) if engine == "sqlite" else None
    data_dir.mkdir(parents=True, exist_ok=True)
    present, pg_data = _check_target(data_dir, db_file, engine, force)

    out = Restored(bundle, data_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    staging = data_dir / f"{STAGING_PREFIX}{stamp}-{uuid.uuid4().hex[:6]}"
    staging.mkdir(mode=0o700)
    try:
        staged_db = _stage(bundle, manifest, staging, engine, images, say, out)
        # The point of no return: the data dir changes from here on.
        connections.close_all()
        if present and force:
            _move_aside(data_dir, db_file, stamp, out)
            say(f"moved the old contents aside to {out.moved_aside[-1]}")
        if engine == "sqlite":
            _install_sqlite(staged_db, db_file)
        else:
            dump = bundle / manifest["database"]["file"]
            _pg_restore(db, dump, data_dir, stamp, force and pg_data, out, say)
            out.rewritten, out.marked_deleted = _rewrite_checkpoints_orm(manifest, data_dir)
            _forget_leases()
        _install_files(staging, data_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _report(out, engine, manifest, db_file, say)
    return out


def _merge(src: Path, dest: Path) -> None:
    for entry in src.iterdir():
        target = dest / entry.name
        if entry.is_dir() and target.is_dir():
            _merge(entry, target)
        else:
            os.replace(entry, target)


def _pg_restore(db: dict, dump: Path, data_dir: Path, stamp: str, save_old: bool, out: Restored,
                say: Log) -> None:
    """Restore a pg_dump into the configured database; with ``save_old`` the
    current contents are dumped aside first (a database cannot be renamed away)."""
    env, argv = pg_env_argv(db)
    if save_old:
        aside = data_dir.parent / f"{data_dir.name}.before-restore-{stamp}"
        aside.mkdir(exist_ok=True)
        old = aside / "database-before-restore.pgdump"
        proc = subprocess.run(["pg_dump", "-Fc", "-f", str(old), *argv, "-d", str(db["NAME"])],
                              env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BackupError(f"could not save the current database before restoring: {proc.stderr[-1000:]}")
        out.moved_aside.append(str(old))
        say(f"saved the current database to {old}")
    proc = subprocess.run(["pg_restore", "--clean", "--if-exists", "--no-owner", "--no-privileges",
                           "--single-transaction", *argv, "-d", str(db["NAME"]), str(dump)],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BackupError(f"pg_restore failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
