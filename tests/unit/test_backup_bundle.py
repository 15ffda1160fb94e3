"""Backup bundles (sessions.backup): round trip, an online copy under concurrent
journal writers, refused bundles that change nothing, the non-empty data dir,
crashed backups and the schedule's keep-K.

The source is the test database (rows committed for real: transactional) plus
a temporary data dir of checkpoint files; restores go into another temporary
data dir with its own SQLite file, never the test database.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from sessions import journal
from sessions.backup import (
    BackupError,
    BundleRefused,
    restore_bundle,
    scheduled_backup,
    verify_bundle,
    write_bundle,
)
from sessions.backup import format as bformat
from sessions.backup import write as bwrite
from sessions.credentials import set_secret
from sessions.models import Agent, AgentLease, AgentMemory, Checkpoint, Credential, Event
from tests.engines import sqlite_only

pytestmark = pytest.mark.django_db(transaction=True)


# The restore target here is a SQLite file; a PostgreSQL bundle (pg_dump) can only
# be restored into PostgreSQL (restore_bundle refuses a cross-engine restore): the
# PostgreSQL round trip is tests/scaleout/test_backup_pg.py.
SQLITE_RESTORE = "these restore the bundle into a SQLite file of their own"


def sqlite_db(path: Path) -> dict:
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}


def tree(path: Path) -> dict[str, str]:
    """Every file under path → its sha256 (what 'unchanged' is checked against)."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def source(tmp_path, workspace, owner):
    """Two agents with transcripts, memory, live and deleted checkpoints whose
    files live in a temporary data dir, a wait-for input and a secret key."""
    data = tmp_path / "src"
    data.mkdir()
    (data / "secret_key").write_text("s3cret-key")
    agents = []
    for n in range(2):
        agent = Agent.objects.create(workspace=workspace, created_by=owner,
                                     spec={"model": "demo", "checkpoint": True}, sandbox_id=f"sb{n}")
        journal.append_many(agent.id, [("message.user", {"text": f"hello {i}"}) for i in range(12)])
        AgentMemory.objects.create(agent=agent, key="k", value={"n": n})
        folder = data / "checkpoints" / agent.id
        folder.mkdir(parents=True)
        for turn in (1, 2, 3):
            path = folder / f"sb{n}-t{turn}-{turn * 4}.tar.zst"
            path.write_bytes(os.urandom(2000 + turn))
            Checkpoint.objects.create(
                agent=agent, sandbox_id=f"sb{n}", turn=turn, through_seq=turn * 4, path=str(path),
                bytes=path.stat().st_size, expires_at=timezone.now() + timedelta(days=30),
                deleted_at=timezone.now() if turn == 1 else None)
        agents.append(agent)
    for agent in agents:  # driven by a worker of the old deployment when the backup ran
        AgentLease.objects.create(agent=agent, holder="old-box/1:2:3", acquired_at=timezone.now(),
                                  expires_at=timezone.now() + timedelta(seconds=20))
    (data / "inputs" / agents[0].id).mkdir(parents=True)
    (data / "inputs" / agents[0].id / "task.txt").write_text("the input")
    return data, agents


def backup(source_dir: Path, to: Path, **kw) -> Path:
    return write_bundle(to, images=False, data_dir=source_dir, **kw)


def restore(bundle: Path, dst: Path, **kw):
    dst.mkdir(parents=True, exist_ok=True)
    return restore_bundle(bundle, images=False, data_dir=dst, database=sqlite_db(dst / "alineo.sqlite3"), **kw)


# --- the round trip -----------------------------------------------------------------------------


@sqlite_only(SQLITE_RESTORE)
def test_round_trip_restores_rows_files_and_rewrites_checkpoint_paths(source, tmp_path):
    data, agents = source
    bundle = backup(data, tmp_path / "backups")
    assert bformat.BUNDLE_NAME.match(bundle.name) and bundle.parent == tmp_path / "backups"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format"] == "alineo-backup" and manifest["version"] == 1
    assert manifest["database"]["engine"] == "sqlite" and manifest["database"]["events"] == 24
    assert manifest["created_at"].endswith("Z") and manifest["app_revision"]
    paths = sorted(f["path"] for f in manifest["files"])
    # Live checkpoints only (turns 2 and 3), plus the input and the secret key.
    assert len([p for p in paths if p.startswith("data/checkpoints/")]) == 4
    assert f"data/inputs/{agents[0].id}/task.txt" in paths and "data/secret_key" in paths
    assert manifest["images"] == [] and "--no-images" in manifest["images_note"]

    dst = tmp_path / "dst"
    done = restore(bundle, dst)
    assert done.files == 6 and done.rewritten == 4 and done.marked_deleted == 0

    conn = sqlite3.connect(dst / "alineo.sqlite3")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        for agent in agents:
            seqs = [r[0] for r in conn.execute(
                f"SELECT seq FROM {Event._meta.db_table} WHERE agent_id=? ORDER BY seq", (agent.id,))]
            assert seqs == list(range(1, 13))
        assert conn.execute(f"SELECT COUNT(*) FROM {AgentMemory._meta.db_table}").fetchone()[0] == 2
        # The old deployment's worker leases are not restored: a worker here takes over at once.
        assert conn.execute(f"SELECT COUNT(*) FROM {AgentLease._meta.db_table}").fetchone()[0] == 0
        rows = conn.execute(f"SELECT path, deleted_at FROM {Checkpoint._meta.db_table} "
                            "WHERE deleted_at IS NULL").fetchall()
    finally:
        conn.close()
    assert len(rows) == 4
    for path, _ in rows:  # every live row points into the NEW data dir, at identical bytes
        new = Path(path)
        assert new.is_relative_to(dst) and new.is_file()
        old = data / new.relative_to(dst)
        assert new.read_bytes() == old.read_bytes()
    assert (dst / "inputs" / agents[0].id / "task.txt").read_text() == "the input"
    assert (dst / "secret_key").read_text() == "s3cret-key"
    assert not list(dst.glob(".restore-*"))


@sqlite_only(SQLITE_RESTORE)
def test_a_checkpoint_file_gone_before_the_copy_is_listed_and_its_row_marked_deleted(source, tmp_path):
    data, agents = source
    gone = Checkpoint.objects.filter(agent=agents[1], turn=2).get()
    Path(gone.path).unlink()
    bundle = backup(data, tmp_path / "backups")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [m["source"] for m in manifest["missing"]] == [gone.path]
    done = restore(bundle, tmp_path / "dst")
    assert done.marked_deleted == 1 and done.rewritten == 3


# --- online and consistent ------------------------------------------------------------------------


@sqlite_only("it reads the bundle's SQLite copy (PostgreSQL bundles hold pg_dump's one-snapshot dump)")
def test_a_backup_while_the_journal_appends_is_consistent(agent, tmp_path):
    stop, errors, written = threading.Event(), [], []

    def writer():
        try:
            i = 0
            while not stop.is_set():
                recs = journal.append_many(agent.id, [("t.w", {"i": i + k}) for k in range(5)])
                written.append(recs[-1].seq)
                i += 5
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    bundles = []
    try:
        while len(written) < 20:
            time.sleep(0.01)
        for _ in range(3):
            bundles.append(backup(tmp_path / "data", tmp_path / "backups"))
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
    heads = []
    for bundle in bundles:
        conn = sqlite3.connect(f"file:{bundle / 'database/alineo.sqlite3'}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            seqs = [r[0] for r in conn.execute(
                f"SELECT seq FROM {Event._meta.db_table} WHERE agent_id=? ORDER BY seq", (agent.id,))]
            last_seq = conn.execute(f"SELECT last_seq FROM {Agent._meta.db_table} WHERE id=?",
                                    (agent.id,)).fetchone()[0]
        finally:
            conn.close()
        assert seqs == list(range(1, len(seqs) + 1)), "a gap in the copied transcript"
        assert len(seqs) % 5 == 0, "a transaction of 5 facts was copied in part"
        assert last_seq == len(seqs), "the agent's head and its events disagree in the copy"
        heads.append(len(seqs))
    assert heads == sorted(heads) and heads[0] >= 100 and heads[-1] < written[-1] + 1


# --- refused bundles change nothing --------------------------------------------------------------


def _truncate(bundle, manifest):
    path = bundle / next(f["path"] for f in manifest["files"] if "checkpoints" in f["path"])
    path.write_bytes(path.read_bytes()[:-100])
    return path.name, "truncated"


def _flip_db_byte(bundle, manifest):
    path = bundle / manifest["database"]["file"]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    return path.name, "sha256"  # alineo.sqlite3, or alineo.pgdump on PostgreSQL


def _flip_file_byte(bundle, manifest):
    path = bundle / next(f["path"] for f in manifest["files"] if "checkpoints" in f["path"])
    raw = bytearray(path.read_bytes())
    raw[7] ^= 0x01
    path.write_bytes(bytes(raw))
    return path.name, "altered"


def _no_manifest(bundle, manifest):
    (bundle / "manifest.json").unlink()
    return "manifest.json", "missing"


def _unknown_version(bundle, manifest):
    manifest["version"] = 99
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return "version 99", "unknown"


def _missing_file(bundle, manifest):
    path = bundle / next(f["path"] for f in manifest["files"] if "checkpoints" in f["path"])
    path.unlink()
    return path.name, "missing"


def _escaping_path(bundle, manifest):
    manifest["files"][0]["path"] = "data/../../etc/passwd"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return "leaves the bundle", ""


def _not_alineo(bundle, manifest):
    manifest["format"] = "something-else"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return "not an Alineo backup", ""


@pytest.mark.parametrize("damage", [_truncate, _flip_db_byte, _flip_file_byte, _no_manifest,
                                    _unknown_version, _missing_file, _escaping_path, _not_alineo],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_bundle_is_refused_and_the_target_is_unchanged(source, tmp_path, damage):
    data, _ = source
    bundle = backup(data, tmp_path / "backups")
    manifest = json.loads((bundle / "manifest.json").read_text())
    names, why = damage(bundle, manifest)

    # A target that holds data, restored with --force: verification still comes first.
    dst = tmp_path / "dst"
    (dst / "checkpoints" / "ag_old").mkdir(parents=True)
    (dst / "checkpoints" / "ag_old" / "x.tar.zst").write_bytes(b"old checkpoint")
    (dst / "alineo.sqlite3").write_bytes(b"old database")
    (dst / "secret_key").write_text("old key")
    before = tree(tmp_path)
    with pytest.raises(BundleRefused) as info:
        restore(bundle, dst, force=True)
    message = str(info.value)
    assert names in message and why in message, message
    assert tree(tmp_path) == before, "a refused restore changed files"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backups", "dst", "src"]

    # The command says so clearly, and changes nothing either.
    with pytest.raises(CommandError) as cmd:
        call_command("restore", "--from", str(bundle), "--no-images")
    assert "refused" in str(cmd.value) and names in str(cmd.value) and "Nothing was changed" in str(cmd.value)
    assert tree(tmp_path) == before


def test_restore_from_the_backup_dir_takes_the_newest_bundle(source, tmp_path):
    data, _ = source
    first = backup(data, tmp_path / "backups")
    time.sleep(1.1)
    second = backup(data, tmp_path / "backups")
    assert first != second
    assert verify_bundle(tmp_path / "backups").bundle == second
    with pytest.raises(BundleRefused, match="not an Alineo backup"):
        verify_bundle(tmp_path / "src")


# --- the target data dir --------------------------------------------------------------------------


@sqlite_only(SQLITE_RESTORE)
def test_a_data_dir_with_data_is_refused_without_force_and_moved_aside_with_it(source, tmp_path):
    data, _ = source
    bundle = backup(data, tmp_path / "backups")
    dst = tmp_path / "dst"
    restore(bundle, dst)
    (dst / "notes.txt").write_text("made after the restore")
    before = tree(dst)
    with pytest.raises(BackupError, match="not empty.*--force"):
        restore(bundle, dst)
    assert tree(dst) == before

    done = restore(bundle, dst, force=True)
    aside = Path(done.moved_aside[0])
    assert aside.name.startswith("dst.before-restore-") and aside.parent == tmp_path
    assert tree(aside) == before, "the old contents were not kept as they were"
    assert not (dst / "notes.txt").exists() and (dst / "alineo.sqlite3").is_file()


@sqlite_only(SQLITE_RESTORE)
def test_a_fresh_data_dir_with_only_a_secret_key_counts_as_empty(source, tmp_path):
    data, _ = source
    bundle = backup(data, tmp_path / "backups")
    dst = tmp_path / "dst"
    (dst / "locks").mkdir(parents=True)
    (dst / "secret_key").write_text("made by settings on import")
    restore(bundle, dst)
    assert (dst / "secret_key").read_text() == "s3cret-key"


# --- crashed backups and the schedule -------------------------------------------------------------


def test_a_crashed_backup_never_looks_complete(source, tmp_path, monkeypatch):
    data, _ = source
    to = tmp_path / "backups"
    calls = []

    def failing_copy(src, dest):
        calls.append(src)
        if len(calls) == 2:
            raise OSError("disk full")
        return original(src, dest)

    original = bwrite.copy_hashing
    monkeypatch.setattr(bwrite, "copy_hashing", failing_copy)
    with pytest.raises(OSError, match="disk full"):
        backup(data, to)
    assert list(to.iterdir()) == []
    # A partial dir left by a killed process is never taken for a bundle.
    (to / (bformat.PARTIAL_PREFIX + "20260101T000000Z-dead")).mkdir()
    assert bformat.bundles_in(to) == []
    with pytest.raises(BundleRefused):
        verify_bundle(to)


def test_scheduled_backup_keeps_the_newest_k_and_clears_partials(source, tmp_path, settings, monkeypatch):
    data, _ = source
    settings.DATA_DIR = data
    to = tmp_path / "backups"
    to.mkdir()
    (to / (bformat.PARTIAL_PREFIX + "20260101T000000Z-dead")).mkdir()
    made = []
    for _ in range(3):
        made.append(scheduled_backup(to, keep=2, images=False))
    names = sorted(p.name for p in to.iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in made[1:])
    assert not list(to.glob(bformat.PARTIAL_PREFIX + "*"))


def test_a_backup_inside_the_data_dir_is_refused(source):
    data, _ = source
    with pytest.raises(BackupError, match="inside the data dir"):
        backup(data, data / "backups")


def test_the_backup_command_writes_a_bundle(source, tmp_path, settings):
    data, _ = source
    settings.DATA_DIR = data
    from io import StringIO

    out = StringIO()
    call_command("backup", "--to", str(tmp_path / "b"), "--no-images", stdout=out)
    bundle = Path(out.getvalue().strip().splitlines()[-1])
    assert bundle.parent == tmp_path / "b" and (bundle / "manifest.json").is_file()
    assert verify_bundle(bundle).manifest["database"]["agents"] == 2
    shutil.rmtree(tmp_path / "b")


def test_no_credential_value_is_ever_in_a_bundle(source, tmp_path, workspace):
    """Only which credentials existed: a bundle copied elsewhere leaks no
    secret (SQLite: the rows are deleted from the copy and the file VACUUMed,
    so no freed page keeps a value; PostgreSQL: pg_dump leaves the rows out)."""
    canary = "canary-" + os.urandom(12).hex()
    set_secret(workspace, "github", canary)
    data, _agents = source
    bundle = backup(data, tmp_path / "backups")
    for path in bundle.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["database"]["credentials_left_out"] == [
        {"workspace": workspace.name, "name": "github"}]
    assert Credential.objects.get(name="github").secret == canary  # the live one is untouched


@sqlite_only(SQLITE_RESTORE)
def test_a_restore_says_which_credentials_to_set_again(source, tmp_path, workspace):
    set_secret(workspace, "github", "canary-value-123")
    data, _agents = source
    said: list[str] = []
    done = restore(backup(data, tmp_path / "backups"), tmp_path / "dst", say=said.append)
    assert any("set_credential" in n and f"{workspace.name}/github" in n for n in done.notes)
    assert any("set_credential" in line for line in said)
