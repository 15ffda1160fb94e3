"""The backup bundle's format: names, the manifest, checksums, finding bundles.

A bundle is one directory::

    alineo-backup-20261129T083102Z/
      manifest.json                  what is here, with sha256 and size of every file
      database/alineo.sqlite3        SQLite: an online copy (sqlite3 backup API), journal_mode=DELETE
      database/alineo.pgdump         PostgreSQL: pg_dump -Fc (instead of the SQLite file)
      data/checkpoints/<agent>/...   the turn checkpoints live Checkpoint rows point at
      data/inputs/<agent>/...        wait-for inputs (the ladder writes them into fresh sandboxes)
      data/secret_key                the data dir's secret key (sessions stay valid)
      images/<repo>_<tag>.tar        `docker save` of the base and setup-snapshot images in use

``manifest.json`` is written last and the directory is renamed into place
only when complete, so a directory with this name and a manifest is a whole
bundle; a crashed backup leaves only a ``.partial-*`` directory.
"""

from __future__ import annotations

from sandboxes.archive import fsync_path  # noqa: F401  (re-exported to the backup modules)

import hashlib
import json
import os
import re
from pathlib import Path

FORMAT = "alineo-backup"
VERSION = 1
#: Versions this code can restore.
KNOWN_VERSIONS = (1,)
MANIFEST = "manifest.json"
BUNDLE_PREFIX = "alineo-backup-"
PARTIAL_PREFIX = ".partial-" + BUNDLE_PREFIX
BUNDLE_NAME = re.compile(r"^alineo-backup-(\d{8}T\d{6}(?:\.\d{6})?Z)(?:-\d+)?$")
SQLITE_NAME = "database/alineo.sqlite3"
PGDUMP_NAME = "database/alineo.pgdump"
CHUNK = 1 << 20


class BackupError(Exception):
    """A backup or restore could not be done; the message says why."""


class BundleRefused(BackupError):
    """A bundle failed verification: nothing was changed."""


def sha256_file(path: str | os.PathLike) -> tuple[str, int]:
    """(hex sha256, bytes) of a file, read in chunks."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n




def safe_relpath(rel: str) -> str:
    """A bundle-relative path from a manifest: no absolute paths, no '..'."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise BundleRefused(f"manifest names an invalid path {rel!r}")
    if rel.startswith("/") or "\\" in rel:
        raise BundleRefused(f"manifest path {rel!r} is absolute")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BundleRefused(f"manifest path {rel!r} leaves the bundle")
    return rel


def is_bundle(path: Path) -> bool:
    return path.is_dir() and BUNDLE_NAME.match(path.name) is not None


def bundles_in(parent: str | os.PathLike) -> list[Path]:
    """Complete-looking bundles in ``parent`` (by name, with a manifest), oldest first."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    found = [p for p in parent.iterdir() if is_bundle(p) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name)


def resolve_bundle(path: str | os.PathLike) -> Path:
    """``--from`` may name a bundle (it has a manifest.json) or the directory
    ``backup --to`` wrote into: then its newest bundle is taken."""
    path = Path(path)
    if not path.exists():
        raise BundleRefused(f"{path} does not exist")
    if not path.is_dir():
        raise BundleRefused(f"{path} is not a directory")
    if (path / MANIFEST).exists() or is_bundle(path):
        return path
    named = sorted((p for p in path.iterdir() if is_bundle(p)), key=lambda p: p.name)
    if named:
        return named[-1]
    raise BundleRefused(f"{path} has no {MANIFEST} and holds no {BUNDLE_PREFIX}* bundle: "
                        "not an Alineo backup")


def load_manifest(bundle: Path) -> dict:
    """The manifest, checked for format and version. Raises BundleRefused."""
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleRefused(f"{bundle}: {MANIFEST} is missing: not a complete Alineo backup "
                            "(a backup that crashed never gets one)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BundleRefused(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleRefused(f"{path}: format is {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                            f"not {FORMAT!r}: not an Alineo backup")
    version = manifest.get("version")
    if version not in KNOWN_VERSIONS:
        raise BundleRefused(
            f"{path}: bundle version {version!r} is unknown to this Alineo (it restores version "
            f"{', '.join(map(str, KNOWN_VERSIONS))}); restore it with the release that wrote it "
            f"(app_revision {manifest.get('app_revision', '?')})")
    return manifest


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
