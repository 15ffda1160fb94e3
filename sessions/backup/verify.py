"""Verifying a bundle before anything is changed (``restore`` runs this first;
``restore --verify-only`` runs only this).

Refused, with a message naming what is wrong: no manifest; an unknown format
or version; a database or file or image that is missing, of the wrong size
or whose sha256 differs; a SQLite copy that does not open or fails
``PRAGMA integrity_check`` (or lacks Alineo's tables); a PostgreSQL dump that
``pg_restore --list`` cannot read; paths that would leave the bundle.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sessions.backup.format import (
    BundleRefused,
    load_manifest,
    resolve_bundle,
    safe_relpath,
    sha256_file,
)
from sessions.models import Agent, Event


@dataclass
class Verified:
    bundle: Path
    manifest: dict
    checked: list[str] = field(default_factory=list)


def _check_file(bundle: Path, rel: str, sha: str, size, what: str) -> Path:
    rel = safe_relpath(rel)
    path = bundle / rel
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise BundleRefused(f"{what} {rel}: not a regular file in the bundle")
    if not path.is_file():
        raise BundleRefused(f"{what} {rel} is missing from the bundle")
    if not isinstance(size, int) or not isinstance(sha, str):
        raise BundleRefused(f"{what} {rel}: the manifest gives no valid size and sha256")
    actual = path.stat().st_size
    if actual != size:
        raise BundleRefused(f"{what} {rel} is {actual} bytes, the manifest says {size}: "
                            f"{'truncated' if actual < size else 'altered'}")
    digest, _ = sha256_file(path)
    if digest != sha:
        raise BundleRefused(f"{what} {rel}: sha256 {digest[:16]}… does not match the manifest's "
                            f"{sha[:16]}…: the file was altered or corrupted")
    return path


def check_sqlite(path: Path) -> None:
    """Opens read-only (nothing written next to it), passes integrity_check, has our tables."""

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            result = conn.execute("PRAGMA integrity_check").fetchall()
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise BundleRefused(f"database {path.name} does not open as SQLite: {exc}") from exc
    if result != [("ok",)]:
        raise BundleRefused(f"database {path.name} fails PRAGMA integrity_check: "
                            f"{'; '.join(str(r[0]) for r in result[:5])}")
    for table in (Agent._meta.db_table, Event._meta.db_table, "django_migrations"):
        if table not in tables:
            raise BundleRefused(f"database {path.name} has no table {table}: not an Alineo database")


def check_pgdump(path: Path) -> None:
    if shutil.which("pg_restore") is None:
        raise BundleRefused("the bundle holds a PostgreSQL dump but pg_restore is not installed "
                            "(apt-get install postgresql-client)")
    proc = subprocess.run(["pg_restore", "--list", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BundleRefused(f"database {path.name}: pg_restore cannot read it: {proc.stderr.strip()[-500:]}")


def verify_bundle(path, *, images: bool = True) -> Verified:
    """Check everything; return the bundle and its manifest, or raise BundleRefused."""
    bundle = resolve_bundle(path)
    manifest = load_manifest(bundle)
    out = Verified(bundle, manifest)
    db = manifest.get("database")
    if not isinstance(db, dict) or db.get("engine") not in ("sqlite", "postgresql"):
        raise BundleRefused(f"{bundle}: the manifest names no database of a known engine")
    db_path = _check_file(bundle, db.get("file", ""), db.get("sha256"), db.get("bytes"), "database")
    if db["engine"] == "sqlite":
        check_sqlite(db_path)
    else:
        check_pgdump(db_path)
    out.checked.append(db["file"])
    files = manifest.get("files")
    if not isinstance(files, list):
        raise BundleRefused(f"{bundle}: the manifest's files is not a list")
    targets = set()
    for entry in files:
        if not isinstance(entry, dict):
            raise BundleRefused(f"{bundle}: a files entry is not an object")
        rel = entry.get("path", "")
        if not str(rel).startswith("data/"):
            raise BundleRefused(f"file {rel!r}: outside the bundle's data/ folder")
        if rel in targets:
            raise BundleRefused(f"file {rel} is listed twice")
        targets.add(rel)
        _check_file(bundle, rel, entry.get("sha256"), entry.get("bytes"), "file")
        out.checked.append(rel)
    if images:
        for entry in manifest.get("images") or []:
            if not isinstance(entry, dict) or not entry.get("tag"):
                raise BundleRefused(f"{bundle}: an images entry has no tag")
            _check_file(bundle, entry.get("file", ""), entry.get("sha256"), entry.get("bytes"),
                        f"image {entry['tag']}")
            out.checked.append(entry["file"])
    return out
