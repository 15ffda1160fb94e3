"""Backup and restore of a whole deployment (docs/DURABILITY.md, "Backup and restore").

    write_bundle(to)              manage.py backup --to DIR      (write.py)
    verify_bundle(path)           manage.py restore --verify-only (verify.py)
    restore_bundle(path)          manage.py restore --from DIR    (restore.py)
    scheduled_backup(dir, keep)   the worker's schedule          (schedule.py)
    run_scheduled_if_due()        reads ALINEO_BACKUP_DIR / _EVERY_S / _KEEP

The bundle format is in format.py.
"""

from sessions.backup.format import BackupError, BundleRefused  # noqa: F401
from sessions.backup.restore import restore_bundle  # noqa: F401
from sessions.backup.schedule import prune, run_scheduled_if_due, scheduled_backup  # noqa: F401
from sessions.backup.verify import verify_bundle  # noqa: F401
from sessions.backup.write import write_bundle  # noqa: F401
