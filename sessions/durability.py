"""The database settings an acknowledged fact relies on, read back from the
connections themselves, not taken from the settings that asked for them.

A fact is acknowledged only once durable (docs/DURABILITY.md): on SQLite that
needs ``journal_mode=WAL`` and ``synchronous=FULL`` (NORMAL can lose the last
commits on power loss; OFF loses them on an OS crash), on PostgreSQL a
``synchronous_commit`` other than ``off``. A kill -9 of a process cannot show
a lost fsync, so nothing else would notice a setting gone wrong: every new
connection of every process (web, worker, management commands, the group
committer's thread) is read back here and refused when it is not durable, and
``serve`` / ``runworker`` log what they read at start.

PostgreSQL's ``fsync`` is the server's, not the connection's: an operator may
turn it off on a throwaway cluster (the test cluster of .ci/services-up does),
so ``fsync=off`` is logged as a warning (once per process), not refused.
"""

from __future__ import annotations

import logging
import weakref

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

log = logging.getLogger(__name__)

#: SQLite's PRAGMA synchronous numbers.
SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
_checked: "weakref.WeakSet" = weakref.WeakSet()  # raw connections already read back (a pool reuses them)


def read_back(connection) -> dict[str, str]:
    """What the database says about durability on this Django connection."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA journal_mode")
            mode = str(cursor.fetchone()[0]).lower()
            cursor.execute("PRAGMA synchronous")
            sync = SQLITE_SYNCHRONOUS.get(int(cursor.fetchone()[0]), "?")
            cursor.execute("PRAGMA busy_timeout")
            return {"vendor": "sqlite", "journal_mode": mode, "synchronous": sync,
                    "busy_timeout_ms": str(cursor.fetchone()[0])}
        if connection.vendor == "postgresql":
            cursor.execute("SHOW synchronous_commit")
            commit = str(cursor.fetchone()[0])
            cursor.execute("SHOW fsync")
            return {"vendor": "postgresql", "synchronous_commit": commit,
                    "fsync": str(cursor.fetchone()[0])}
    return {"vendor": connection.vendor}


def refusal(found: dict[str, str]) -> str | None:
    """Why these settings cannot acknowledge a fact, or None."""
    if found.get("vendor") == "sqlite":
        if found["journal_mode"] != "wal":
            return f"journal_mode is {found['journal_mode']}, not wal"
        if found["synchronous"] not in ("FULL", "EXTRA"):
            return f"synchronous is {found['synchronous']}, not FULL"
    elif found.get("vendor") == "postgresql" and found["synchronous_commit"] == "off":
        return "synchronous_commit is off"
    return None


_warned: list[str] = []


def _warn_fsync(found: dict[str, str]) -> None:
    if found.get("vendor") == "postgresql" and found.get("fsync") != "on" and not _warned:
        _warned.append(found["fsync"])
        log.warning("PostgreSQL runs with fsync=%s: a power loss can lose acknowledged facts "
                    "(fine for a throwaway test cluster, never for production)", found["fsync"])


def describe(found: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in found.items())


def on_connection(sender, connection, **kwargs) -> None:
    """``connection_created``: refuse a connection that could lose an acknowledged fact."""
    raw = connection.connection
    if raw in _checked:  # False for what cannot be weakly referenced (sqlite3's)
        return
    found = read_back(connection)
    why = refusal(found)
    _warn_fsync(found)
    if why is not None:
        connection.close()
        raise ImproperlyConfigured(f"the database connection is not durable: {why} "
                                   "(acknowledged facts need it; docs/DURABILITY.md)")
    try:
        _checked.add(raw)
    except TypeError:  # sqlite3's connections: a new one each time, read back each time (µs)
        pass


def check_default() -> str:
    """The read-back of this process's default connection, for its start line."""
    connection = connections["default"]
    connection.ensure_connection()
    return describe(read_back(connection))
