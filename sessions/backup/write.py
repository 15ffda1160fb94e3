"""Writing a bundle: ``write_bundle(to)`` (``manage.py backup --to DIR``).

Online: nothing here stops or pauses the server.

* SQLite: the sqlite3 backup API copies the database in ONE step, i.e. inside
  one read transaction of a WAL database: the copy is the committed state at
  one instant, whatever writers do meanwhile (they are not blocked). The copy
  is switched to ``journal_mode=DELETE`` (one self-contained file) and must
  pass ``PRAGMA integrity_check`` before it is accepted.
* PostgreSQL (``DATABASE_URL``): ``pg_dump -Fc``, which reads one snapshot.

The files come after the database and are chosen FROM THE COPY: every
Checkpoint row of the copy that is not deleted names a file, and that file is
copied (hashing while copying). A file rotated away between the database copy
and the file copy is listed under ``missing`` in the manifest (restore marks
its row deleted; the ladder then takes an older checkpoint or rebuilds from
the transcript). Wait-for inputs (``DATA_DIR/inputs``) and the secret key go
along. Images: ``docker save`` of the base image and setup snapshots the
agents' specs use, when the docker backend is in use; an image already in a
previous bundle of the same directory (same image id) is hardlinked, not
saved again.

Everything is written into ``DIR/.partial-alineo-backup-*`` and renamed to
``DIR/alineo-backup-<UTC time>`` once the manifest is in: a crashed backup
never looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connections

from sandboxes.backends import docker_engine_answers, get_backend, resolve_backend_name
from sandboxes.images import resolve_image
from sandboxes.setup import needs_setup, setup_key, setup_ref
from sessions.backup import credentials
from sessions.backup.format import (
    BUNDLE_PREFIX,
    CHUNK,
    FORMAT,
    MANIFEST,
    PARTIAL_PREFIX,
    PGDUMP_NAME,
    SQLITE_NAME,
    VERSION,
    BackupError,
    bundles_in,
    fsync_path,
    load_manifest,
    sha256_file,
    write_json,
)
from sessions.models import Agent, Checkpoint, Event

log = logging.getLogger(__name__)
Log = Callable[[str], None]


# --- what the server uses -------------------------------------------------------------------------
def database_settings() -> dict:
    """The default database as the running process knows it (under pytest: the test DB)."""

    return dict(connections["default"].settings_dict)


def engine_of(db: dict) -> str:
    engine = db.get("ENGINE", "")
    if engine.endswith("sqlite3"):
        return "sqlite"
    if "postgresql" in engine:
        return "postgresql"
    raise BackupError(f"backups support SQLite and PostgreSQL, not {engine!r}")


def sqlite_path(db: dict) -> Path:
    name = str(db.get("NAME") or "")
    if not name or name == ":memory:" or "mode=memory" in name:
        raise BackupError("the database is in memory: there is nothing durable to back up")
    return Path(name)


def app_revision() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
        if rev.returncode == 0 and rev.stdout.strip():
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                                   capture_output=True, text=True, timeout=10, check=False)
            return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def _tables():

    return Agent._meta.db_table, Checkpoint._meta.db_table, Event._meta.db_table


# --- the database ---------------------------------------------------------------------------------
def copy_sqlite_online(src_path: Path, dest: Path) -> None:
    """A consistent copy of a live SQLite database (see the module doc)."""
    if not src_path.is_file():
        raise BackupError(f"the database file {src_path} does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(src_path, timeout=30)  # only read from
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)  # pages=-1: one step, one read snapshot
            dst.execute("PRAGMA journal_mode=DELETE")
            result = dst.execute("PRAGMA integrity_check").fetchall()
            if result != [("ok",)]:
                raise BackupError(f"the copy of {src_path} fails integrity_check: {result[:5]}")
            dst.commit()
        finally:
            dst.close()
    finally:
        src.close()
    with open(dest, "rb+") as fh:
        os.fsync(fh.fileno())


def pg_env_argv(db: dict) -> tuple[dict, list[str]]:
    env = dict(os.environ)
    argv = []
    if db.get("HOST"):
        argv += ["-h", str(db["HOST"])]
    if db.get("PORT"):
        argv += ["-p", str(db["PORT"])]
    if db.get("USER"):
        argv += ["-U", str(db["USER"])]
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    return env, argv


def dump_postgres(db: dict, dest: Path) -> None:
    if shutil.which("pg_dump") is None:
        raise BackupError("DATABASE_URL is PostgreSQL but pg_dump is not installed "
                          "(apt-get install postgresql-client)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    env, argv = pg_env_argv(db)
    proc = subprocess.run(["pg_dump", "-Fc", "--no-owner", "--no-privileges", "-f", str(dest),
                           *credentials.PG_DUMP_ARGS, *argv, "-d", str(db["NAME"])],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BackupError(f"pg_dump failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    with open(dest, "rb+") as fh:
        os.fsync(fh.fileno())


def _rows_from_sqlite(copy: Path) -> tuple[list[tuple], list[tuple], dict]:
    agent_t, cp_t, ev_t = _tables()
    conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        cps = conn.execute(f"SELECT id, agent_id, path FROM {cp_t} "
                           "WHERE deleted_at IS NULL AND path != '' ORDER BY id").fetchall()
        agents = [(a, json.loads(s) if isinstance(s, str) else (s or {}), st)
                  for a, s, st in conn.execute(f"SELECT id, spec, status FROM {agent_t}")]
        counts = {"agents": len(agents),
                  "events": conn.execute(f"SELECT COUNT(*) FROM {ev_t}").fetchone()[0],
                  "checkpoints": len(cps)}
    finally:
        conn.close()
    return cps, agents, counts


def _rows_from_orm() -> tuple[list[tuple], list[tuple], dict]:

    cps = list(Checkpoint.objects.filter(deleted_at__isnull=True).exclude(path="")
               .order_by("id").values_list("id", "agent_id", "path"))
    agents = list(Agent.objects.values_list("id", "spec", "status"))
    counts = {"agents": len(agents), "events": Event.objects.count(), "checkpoints": len(cps)}
    return cps, agents, counts


# --- files ------------------------------------------------------------------------------------------
def copy_hashing(src: Path, dest: Path) -> tuple[str, int]:
    """Copy src to dest (fsynced), returning the sha256 and size of what was written."""

    dest.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while True:
            chunk = fin.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            fout.write(chunk)
            n += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    shutil.copymode(src, dest)
    return h.hexdigest(), n


def _bundle_rel(path: Path, data_dir: Path, agent_id: str) -> str:
    """Where a data-dir file goes in the bundle: ``data/<path relative to DATA_DIR>``;
    a checkpoint outside the data dir goes under ``data/checkpoints/<agent>/``."""
    try:
        rel = path.resolve().relative_to(data_dir.resolve())
        return "data/" + rel.as_posix()
    except ValueError:
        return f"data/checkpoints/{agent_id}/{path.name}"


# --- images -----------------------------------------------------------------------------------------
def image_tags(agents: list[tuple], note: list[str]) -> list[str]:
    """The base and setup-snapshot images the agents' specs use (docker backend)."""

    backend = get_backend()
    if not backend.has_engine_images:
        note.append(f"the {backend.name} backend is in use: no images to save (its setup "
                    "snapshots are rebuilt on demand from the specs)")
        return []
    tags: list[str] = []
    for agent_id, spec, _status in agents:
        spec = spec if isinstance(spec, dict) else {}
        image = spec.get("image") or "default"
        try:
            tags.append(resolve_image(image))
        except Exception as exc:  # noqa: BLE001 - a spec we cannot resolve is reported, not fatal
            note.append(f"agent {agent_id}: image {image!r} not resolved ({exc})")
            continue
        if needs_setup(spec):
            try:
                tags.append(setup_ref(backend, setup_key(backend, spec)))
            except Exception as exc:  # noqa: BLE001
                note.append(f"agent {agent_id}: setup snapshot not resolved ({exc})")
    return list(dict.fromkeys(tags))


def _image_file(tag: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in tag)
    return f"images/{safe}.tar"


def _previous_images(to: Path) -> dict[str, tuple[Path, dict]]:
    """image id → (file, manifest entry) from earlier bundles in the same directory."""
    out: dict[str, tuple[Path, dict]] = {}
    for bundle in bundles_in(to):
        try:
            manifest = load_manifest(bundle)
        except BackupError:
            continue
        for entry in manifest.get("images") or []:
            path = bundle / entry.get("file", "")
            if entry.get("id") and path.is_file() and path.stat().st_size == entry.get("bytes"):
                out[entry["id"]] = (path, entry)
    return out


def _write_image(client, tag: str, dest: Path) -> tuple[str, int]:
    """``docker save`` of one image into dest (fsynced); returns its sha256 and size."""

    h, size = hashlib.sha256(), 0
    with open(dest, "wb") as fh:
        for chunk in client.api.get_image(tag, chunk_size=CHUNK):
            h.update(chunk)
            fh.write(chunk)
            size += len(chunk)
        fh.flush()
        os.fsync(fh.fileno())
    return h.hexdigest(), size


def _save_image(client, tag: str, image_id: str, tmp: Path,
                previous: dict[str, tuple[Path, dict]]) -> tuple[dict, str]:
    """One image into the bundle: hardlinked from an earlier bundle that holds
    the same image under the same tag, else saved. Returns (manifest entry, how)."""
    rel = _image_file(tag)
    dest = tmp / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    prev = previous.get(image_id)
    if prev is not None and prev[1].get("tag") == tag:
        os.link(prev[0], dest)
        digest, size = prev[1]["sha256"], prev[1]["bytes"]
        how = "linked from " + prev[0].parent.parent.name
    else:
        digest, size = _write_image(client, tag, dest)
        how = "saved"
    return {"tag": tag, "id": image_id, "file": rel, "sha256": digest, "bytes": size}, how


def save_images(tags: list[str], tmp: Path, to: Path, note: list[str], say: Log) -> list[dict]:

    if not tags:
        return []
    if not docker_engine_answers():
        note.append("no Docker engine answers: images not saved; the restore machine needs the "
                    "base image (manage.py build_base_image) and rebuilds setup snapshots")
        return []
    import docker
    import docker.errors

    client = docker.from_env(timeout=None)
    previous = _previous_images(to)
    out = []
    try:
        for tag in tags:
            try:
                info = client.api.inspect_image(tag)
            except docker.errors.ImageNotFound:
                note.append(f"image {tag} is not present here: not saved")
                continue
            t0 = time.monotonic()
            entry, how = _save_image(client, tag, info["Id"], tmp, previous)
            out.append(entry)
            say(f"image {tag}: {how}, {entry['bytes'] / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s")
    finally:
        client.close()
    return out


# --- the bundle ---------------------------------------------------------------------------------------
def _bundle_name(to: Path, when: datetime) -> Path:
    base = BUNDLE_PREFIX + when.strftime("%Y%m%dT%H%M%SZ")
    path, n = to / base, 1
    while path.exists():
        n += 1
        path = to / f"{base}-{n}"
    return path


def _check_target(to: Path, data_dir: Path) -> None:
    if to == data_dir or data_dir in to.parents:
        raise BackupError(f"--to {to} lies inside the data dir {data_dir}: a backup must live elsewhere")


def _copy_database(db: dict, tmp: Path, say: Log) -> tuple[dict, list[tuple], list[tuple]]:
    """Copy the database into the bundle; returns its manifest entry and, read
    from the copy, the live checkpoint rows and the agents (id, spec, status)."""
    engine = engine_of(db)
    t0 = time.monotonic()
    if engine == "sqlite":
        copy_sqlite_online(sqlite_path(db), tmp / SQLITE_NAME)
        db_rel = SQLITE_NAME
        left_out = credentials.left_out_of_sqlite(tmp / SQLITE_NAME)
        cps, agents, counts = _rows_from_sqlite(tmp / SQLITE_NAME)
    else:
        dump_postgres(db, tmp / PGDUMP_NAME)
        db_rel = PGDUMP_NAME
        left_out = credentials.left_out_of_postgres()
        cps, agents, counts = _rows_from_orm()
    digest, size = sha256_file(tmp / db_rel)
    say(f"database ({engine}): {size / 1e6:.1f} MB, {counts['agents']} agents, "
        f"{counts['events']} events, copied online in {time.monotonic() - t0:.2f} s")
    entry = {"engine": engine, "file": db_rel, "sha256": digest, "bytes": size, **counts,
             "credentials_left_out": left_out}
    return entry, cps, agents


def _copy_checkpoints(cps: list[tuple], data_dir: Path, tmp: Path) -> tuple[list[dict], list[dict]]:
    """The checkpoint files the copied rows name; returns (files, missing)."""
    files: list[dict] = []
    missing: list[dict] = []
    seen: set[str] = set()
    for _pk, agent_id, path in cps:
        src = Path(path)
        rel = _bundle_rel(src, data_dir, agent_id)
        if rel in seen:
            continue
        try:
            digest, size = copy_hashing(src, tmp / rel)
        except FileNotFoundError:
            missing.append({"source": path, "reason": "file gone when copied (rotated or "
                            "deleted after the database copy)"})
            continue
        seen.add(rel)
        files.append({"path": rel, "sha256": digest, "bytes": size, "source": path})
    return files, missing


def _copy_other_files(data_dir: Path, tmp: Path) -> list[dict]:
    """Wait-for inputs and the secret key."""
    extras = [p for p in sorted((data_dir / "inputs").rglob("*")) if p.is_file()] \
        if (data_dir / "inputs").is_dir() else []
    if (data_dir / "secret_key").is_file():
        extras.append(data_dir / "secret_key")
    files = []
    for src in extras:
        rel = "data/" + src.relative_to(data_dir).as_posix()
        try:
            digest, size = copy_hashing(src, tmp / rel)
        except FileNotFoundError:
            continue
        files.append({"path": rel, "sha256": digest, "bytes": size})
    return files


def _copy_files(cps: list[tuple], data_dir: Path, tmp: Path, say: Log) -> tuple[list[dict], list[dict]]:
    t0 = time.monotonic()
    files, missing = _copy_checkpoints(cps, data_dir, tmp)
    n_cp = len(files)
    files += _copy_other_files(data_dir, tmp)
    say(f"files: {n_cp} checkpoint(s) and {len(files) - n_cp} other file(s), "
        f"{sum(f['bytes'] for f in files) / 1e6:.1f} MB in {time.monotonic() - t0:.2f} s"
        + (f"; {len(missing)} checkpoint file(s) gone meanwhile" if missing else ""))
    return files, missing


def _save_images_noted(images: bool, agents: list[tuple], tmp: Path, to: Path,
                       say: Log) -> tuple[list[dict], list[str]]:
    """The images the agents use, when asked for; returns (saved, notes)."""
    note: list[str] = []
    saved: list[dict] = []
    if images:
        saved = save_images(image_tags(agents, note), tmp, to, note, say)
    else:
        note.append("images not saved (--no-images)")
    for line in note:
        say(f"note: {line}")
    return saved, note


def _manifest(when: datetime, data_dir: Path, database: dict, files: list[dict],
              missing: list[dict], saved: list[dict], note: list[str]) -> dict:

    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": when.isoformat().replace("+00:00", "Z"),
        "app_revision": app_revision(),
        "data_dir": str(data_dir),
        "backend": resolve_backend_name(),
        "database": database,
        "files": files,
        "missing": missing,
        "images": saved,
        "images_note": "; ".join(note),
    }


def _seal(tmp: Path, to: Path, when: datetime, manifest: dict) -> Path:
    """Write the manifest, make everything durable, then rename the partial
    directory to its final name: only a complete bundle ever has that name."""
    write_json(tmp / MANIFEST, manifest)
    # Deepest first, so every directory entry is on disk before its parent's.
    for d in sorted({p for p in tmp.rglob("*") if p.is_dir()} | {tmp}, key=lambda p: -len(p.parts)):
        fsync_path(d)
    final = _bundle_name(to, when)
    os.rename(tmp, final)
    fsync_path(to)
    return final


def write_bundle(to: str | os.PathLike, *, images: bool = True, data_dir: str | os.PathLike | None = None,
                 database: dict | None = None, say: Log = lambda m: None) -> Path:
    """Write one complete bundle into ``to`` and return its path (see the module doc).
    ``data_dir`` and ``database`` (a Django DATABASES entry) default to the running
    deployment's."""

    t_start = time.monotonic()
    to = Path(to).resolve()
    data_dir = Path(data_dir or settings.DATA_DIR).resolve()
    _check_target(to, data_dir)
    to.mkdir(parents=True, exist_ok=True)
    when = datetime.now(UTC)
    tmp = to / f"{PARTIAL_PREFIX}{when:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o700)
    try:
        db_entry, cps, agents = _copy_database(database or database_settings(), tmp, say)
        files, missing = _copy_files(cps, data_dir, tmp, say)
        saved, note = _save_images_noted(images, agents, tmp, to, say)
        manifest = _manifest(when, data_dir, db_entry, files, missing, saved, note)
        final = _seal(tmp, to, when, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = sum(f["bytes"] for f in files) + db_entry["bytes"] + sum(i["bytes"] for i in saved)
    say(f"backup complete: {final} ({total / 1e6:.1f} MB) in {time.monotonic() - t_start:.2f} s")
    return final
