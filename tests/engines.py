"""Engine-aware helpers: the suite runs on SQLite (the default) and, in CI, again
on PostgreSQL + Redis (DATABASE_URL, REDIS_URL; see `make test`).

    vendor()                      "sqlite" | "postgresql"
    sqlite_only(reason)           marks (and off SQLite, skips) what only SQLite has
    refuse_writes(connection)     the database refuses this connection's writes
    database_env()                env for a subprocess on the *current* (test) database
    database_url(name=None)       DATABASE_URL of the current database (PostgreSQL)
"""

from __future__ import annotations

import contextlib
import os
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection as default_connection


def vendor() -> str:
    return default_connection.vendor


def sqlite_only(reason: str):
    """Marks a test `sqlite_only` (make test's PostgreSQL pass deselects those:
    they ran in its SQLite pass) and skips it, with the reason, when a run by
    hand is on another engine."""
    skip = pytest.mark.skipif(vendor() != "sqlite", reason=f"SQLite only: {reason}")

    def mark(test):
        return pytest.mark.sqlite_only(skip(test))

    return mark


@contextlib.contextmanager
def refuse_writes(connection=default_connection):
    """Every write on `connection` fails until the block ends, as when the
    database has gone read-only: SQLite's `PRAGMA query_only`, PostgreSQL's
    `default_transaction_read_only` (both per connection)."""
    on, off = {
        "sqlite": ("PRAGMA query_only = ON", "PRAGMA query_only = OFF"),
        "postgresql": ("SET default_transaction_read_only = on", "SET default_transaction_read_only = off"),
    }[connection.vendor]
    with connection.cursor() as cur:
        cur.execute(on)
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(off)


def database_url(name: str | None = None) -> str:
    """The DATABASE_URL of the database Django uses now (the test database
    during tests), or of `name` on the same server."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise RuntimeError("database_url() is for PostgreSQL")
    base = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(base._replace(path="/" + quote(name or str(db["NAME"]))))


def database_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) pointed at the current database, so a
    subprocess (another server, a restarted one) sees the test's rows."""
    out = dict(os.environ if env is None else env)
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        out.pop("DATABASE_URL", None)
        out["ALINEO_DB_PATH"] = str(db["NAME"])
    else:
        out["DATABASE_URL"] = database_url()
    return out
