"""Backups on a schedule, keeping the newest K.

    scheduled_backup(dir, keep)      # one bundle now, then prune to the newest `keep`
    run_scheduled_if_due()           # the supervisor's hook: reads the settings, backs up when due

Settings (alineo_site/settings.py):
``ALINEO_BACKUP_DIR`` (empty: no scheduled backups), ``ALINEO_BACKUP_EVERY_S``
(default 86400) and ``ALINEO_BACKUP_KEEP`` (default 7). Both functions block
(a docker save can take seconds): call them from a thread, e.g.
``await asyncio.to_thread(run_scheduled_if_due)``.

One backup at a time per directory: a non-blocking flock on ``DIR/.lock``;
a second caller returns None. Holding the lock, leftover ``.partial-*``
directories are from crashed backups and are removed.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections

from sessions.backup.format import PARTIAL_PREFIX, bundles_in, load_manifest
from sessions.backup.write import write_bundle

log = logging.getLogger(__name__)


def prune(directory: str | os.PathLike, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` bundles; returns what was removed."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    doomed = bundles_in(directory)[:-keep]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def scheduled_backup(directory: str | os.PathLike, keep: int, *, images: bool = True) -> Path | None:
    """Write one bundle into ``directory`` and keep the newest ``keep``. None when
    another backup into the same directory is running."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("backup into %s skipped: another one is running", directory)
            return None
        try:
            for stale in directory.glob(PARTIAL_PREFIX + "*"):
                shutil.rmtree(stale, ignore_errors=True)
            bundle = write_bundle(directory, images=images, say=log.info)
            removed = prune(directory, keep)
            if removed:
                log.info("backup: removed %d old bundle(s), keeping %d", len(removed), keep)
            return bundle
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def newest_age_s(directory: str | os.PathLike) -> float | None:
    """Seconds since the newest bundle in ``directory`` was made (None: no bundle)."""
    found = bundles_in(directory)
    if not found:
        return None
    try:
        created = load_manifest(found[-1])["created_at"].replace("Z", "+00:00")
        return time.time() - datetime.fromisoformat(created).timestamp()
    except Exception:  # noqa: BLE001 - an unreadable newest bundle: go by its mtime
        return time.time() - found[-1].stat().st_mtime


def run_scheduled_if_due() -> Path | None:
    """The worker's hook: back up into ALINEO_BACKUP_DIR when the newest bundle there
    is older than ALINEO_BACKUP_EVERY_S. Never raises (a failed backup is logged and
    retried at the next call); returns the new bundle or None."""
    directory = settings.ALINEO_BACKUP_DIR
    if not directory:
        return None
    every = settings.ALINEO_BACKUP_EVERY_S
    keep = settings.ALINEO_BACKUP_KEEP
    age = newest_age_s(directory)
    if age is not None and age < every:
        return None
    try:
        return scheduled_backup(directory, keep)
    except Exception:
        log.exception("scheduled backup into %s failed", directory)
        return None
    finally:

        close_old_connections()
