"""The group committer's transaction on the DB-API connection itself.

Measured (bench/append_throughput.py): atomic() and Django's cursor wrapper
cost ~0.15 ms of Python per transaction, as much as the write itself. The
committer thread never runs inside an atomic block, so it issues BEGIN …
COMMIT itself, on SQLite (``BEGIN IMMEDIATE``, sqlite3) and on PostgreSQL
(``BEGIN``, psycopg; Django keeps the connection in autocommit, so an
explicit BEGIN opens the transaction). Errors still come out as Django's
(``wrap_database_errors``). On PostgreSQL the writes and BEGIN go in one
pipeline (:func:`run_pipelined`). Callers use it only when nothing watches the
committer's queries (execute wrappers, query capture, DEBUG): those get the
Django path, so they see every statement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

BEGIN = {"sqlite": "BEGIN IMMEDIATE", "postgresql": "BEGIN"}
PLACEHOLDER = {"sqlite": "?", "postgresql": "%s"}


def usable(db) -> bool:
    """True when `db` can take the raw path: a known vendor, nothing watching its queries."""
    return db.vendor in BEGIN and not db.execute_wrappers and not db.queries_logged


def run(db, write: Callable[[Any, str], T], before_commit: Callable[[], None] | None = None) -> T:
    """BEGIN, ``write(cursor, placeholder)``, ``before_commit()``, COMMIT; ROLLBACK on any error."""
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        cur = raw.cursor()
        try:
            cur.execute(BEGIN[db.vendor])
            try:
                written = write(cur, PLACEHOLDER[db.vendor])
                if before_commit is not None:
                    before_commit()
                cur.execute("COMMIT")
            except BaseException:
                _roll_back(db, raw, cur)
                raise
        finally:
            cur.close()
    return written


def run_pipelined(db, statements: list[tuple[str, list]], finish: Callable[[list], T],
                  before_commit: Callable[[], None] | None = None) -> T:
    """PostgreSQL: BEGIN and every statement in one round trip (psycopg's
    pipeline, server-side binding); ``finish(rows)`` with each statement's first
    row (it may refuse: ROLLBACK), ``before_commit()``, COMMIT. One round trip
    for the writes and one for the COMMIT, as the raw driver's executemany."""
    import psycopg

    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        cursors = [psycopg.Cursor(raw) for _ in range(len(statements) + 1)]
        try:
            try:
                with raw.pipeline():
                    cursors[0].execute("BEGIN")
                    for cur, (sql, params) in zip(cursors[1:], statements):
                        cur.execute(sql, params)
                written = finish([cur.fetchone() for cur in cursors[1:]])
                if before_commit is not None:
                    before_commit()
                cursors[0].execute("COMMIT")
            except BaseException:
                if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    _roll_back(db, raw, cursors[0])
                raise
        finally:
            for cur in cursors:
                cur.close()
    return written


def _roll_back(db, raw, cur) -> None:
    if db.vendor == "sqlite" and not raw.in_transaction:
        return
    try:
        cur.execute("ROLLBACK")
    except Exception:  # a broken connection: the server rolls back when it goes
        log.warning("journal committer: ROLLBACK failed", exc_info=True)
