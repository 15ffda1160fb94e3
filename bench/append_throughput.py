#!/usr/bin/env python
"""Append throughput: the journal (group commit, durable commits) against the
raw driver's executemany of the same rows into the same table, on SQLite
(sqlite3, WAL + synchronous=FULL) and on PostgreSQL (psycopg, fsync and
synchronous_commit on).

Cases, each repeated and interleaved with its baseline (medians of rows/s):

1. concurrent singles: 8 threads each call journal.append() one fact at a time
   on 4 agents; the group committer batches whatever is queued.
   Baseline: raw executemany of the same rows in exactly the batch sizes the
   committer formed in that run (same rows, same transactions). Target >= 0.5x.
   For reference: raw executemany of 8 rows per transaction (a perfect group
   commit of the 8 writers with nothing else to do), and the raw driver with
   the same 8 threads committing one row per transaction (no group commit).
2. append_many(100): one thread, batches of 100 facts.
   Baseline: raw executemany of 100 rows per transaction, alternating with
   the journal every 5 transactions (both see the same disk). Target >= 0.5x.

Both sides write the same table (agent_sessions_event, with its unique index,
foreign key and append-only triggers) in the same database. The raw side
writes to agents of its own. SQLite: BEGIN IMMEDIATE, the same file.
PostgreSQL: a scratch database on the server bench/_pg.py provides (the one
bench/run started, ALINEO_BENCH_DATABASE_URL / DATABASE_URL, or a throwaway
cluster); its half runs in a child process, because Django's settings read
DATABASE_URL at import. Without PostgreSQL its rows print as skipped.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

THREADS = 8
AGENTS = 4
TARGET = 0.5


class SqliteRaw:
    """sqlite3 at the journal's PRAGMAs: WAL, synchronous=FULL, BEGIN IMMEDIATE."""

    name = "SQLite"
    INSERT = "INSERT INTO agent_sessions_event (agent_id, seq, type, data, ts) VALUES (?, ?, ?, ?, ?)"

    def __init__(self, path: str):
        self.path = path

    def connect(self):
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=20, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")  # Django turns it on for its connections too
        return conn

    def begin(self, conn):
        conn.execute("BEGIN IMMEDIATE")

    def write(self, conn, rows):
        conn.executemany(self.INSERT, rows)

    def commit(self, conn):
        conn.execute("COMMIT")

    @staticmethod
    def ts():
        return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")


class PgRaw:
    """psycopg 3 straight (what Django's backend wraps): executemany of the
    same INSERT the journal issues (data cast to jsonb), one transaction."""

    name = "PostgreSQL"
    INSERT = "INSERT INTO agent_sessions_event (agent_id, seq, type, data, ts) VALUES (%s, %s, %s, %s::jsonb, %s)"

    def __init__(self, url: str):
        self.url = url

    def connect(self):
        import psycopg

        return psycopg.connect(self.url)

    def begin(self, conn):
        pass  # psycopg opens the transaction with the first statement

    def write(self, conn, rows):
        with conn.cursor() as cur:
            cur.executemany(self.INSERT, rows)

    def commit(self, conn):
        conn.commit()

    @staticmethod
    def ts():
        return datetime.now(timezone.utc)


class RawWriter:
    """Rows exactly as the journal writes them, without the journal."""

    def __init__(self, db, agent_id: str):
        self.db = db
        self.agent_id = agent_id
        self.seq = 0

    def rows(self, n: int):
        ts = self.db.ts()
        out = []
        for etype, data in C.facts(self.seq, n):
            self.seq += 1
            out.append((self.agent_id, self.seq, etype, C.json_text(data), ts))
        return out


def raw_batched(db, writer: RawWriter, total: int, batch: int | list[int]) -> float:
    """One thread, `batch` rows per transaction (or exactly these batch sizes). rows/s."""
    conn = db.connect()
    sizes = batch if isinstance(batch, list) else [batch] * (total // batch)
    batches = [writer.rows(n) for n in sizes]
    t0 = C.now()
    for rows in batches:
        db.begin(conn)
        db.write(conn, rows)
        db.commit(conn)
    dt = C.now() - t0
    conn.close()
    return sum(sizes) / dt


def race(work, barrier: threading.Barrier) -> float:
    """THREADS threads run work(i), released together once all wait at the
    barrier (of THREADS + 1); the seconds from the release until all are done."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = C.now()
    for t in threads:
        t.join()
    return C.now() - t0


def raw_threads_singles(db, writers: list[RawWriter], per_thread: int) -> float:
    """THREADS threads, one row per transaction each (no group commit). rows/s."""
    conns = [db.connect() for _ in range(THREADS)]
    lock = threading.Lock()  # seq allocation for a shared agent, as an app would need
    barrier = threading.Barrier(THREADS + 1)
    errors: list[BaseException] = []

    def work(i):
        conn, w = conns[i], writers[i % len(writers)]
        barrier.wait()
        try:
            for _ in range(per_thread):
                db.begin(conn)
                with lock:  # seq order = commit order, as the journal's agent row lock gives
                    rows = w.rows(1)
                    db.write(conn, rows)
                db.commit(conn)
        except BaseException as exc:  # pragma: no cover - reported
            errors.append(exc)

    dt = race(work, barrier)
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    return THREADS * per_thread / dt


def journal_threads_singles(agent_ids: list[str], per_thread: int, batch_sizes: list[int]) -> float:
    from django.db import connection

    from sessions import journal

    barrier = threading.Barrier(THREADS + 1)
    errors: list[BaseException] = []
    payload = C.facts(0, per_thread)

    def work(i):
        agent = agent_ids[i % len(agent_ids)]
        connection.ensure_connection()
        barrier.wait()
        try:
            for etype, data in payload:
                journal.append(agent, etype, data)
        except BaseException as exc:  # pragma: no cover - reported
            errors.append(exc)
        finally:
            connection.close()

    journal.committer.on_batch = batch_sizes.append
    try:
        dt = race(work, barrier)
    finally:
        journal.committer.on_batch = None
    if errors:
        raise errors[0]
    return THREADS * per_thread / dt


def many_interleaved(agent_id: str, db, writer: RawWriter, total: int, batch: int, start: int,
                     slice_batches: int = 5) -> tuple[float, float]:
    """append_many(batch) against raw executemany(batch), alternating every
    `slice_batches` transactions so both see the same disk. Returns (journal rows/s, raw rows/s)."""
    from django.db import connection

    from sessions import journal

    connection.ensure_connection()
    conn = db.connect()
    n = total // batch
    j_batches = [C.facts(start + k * batch, batch) for k in range(n)]
    r_batches = [writer.rows(batch) for _ in range(n)]
    tj = tr = 0.0
    for k in range(0, n, slice_batches):
        t0 = C.now()
        for b in j_batches[k:k + slice_batches]:
            journal.append_many(agent_id, b)
        t1 = C.now()
        for rows in r_batches[k:k + slice_batches]:
            db.begin(conn)
            db.write(conn, rows)
            db.commit(conn)
        t2 = C.now()
        tj += t1 - t0
        tr += t2 - t1
    conn.close()
    return n * batch / tj, n * batch / tr


def pg_raw(database_url: str):
    """The raw side for PostgreSQL, once the server is known to commit durably."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        sync = cur.fetchone()[0]
        cur.execute("SHOW fsync")
        fsync = cur.fetchone()[0]
    assert sync == "on" and fsync == "on", f"synchronous_commit={sync} fsync={fsync}: expected on / on"
    return PgRaw(database_url), "PostgreSQL", "synchronous_commit=on"


def sqlite_raw():
    """The raw side for the SQLite file, once Django's connection is known to run at the PRAGMAs it copies."""
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cur:  # the settings we compare at
        cur.execute("PRAGMA journal_mode")
        jm = cur.fetchone()[0]
        cur.execute("PRAGMA synchronous")
        sync = cur.fetchone()[0]
    assert jm == "wal" and sync == 2, f"journal_mode={jm} synchronous={sync}: expected wal / 2 (FULL)"
    return SqliteRaw(str(settings.DATABASES["default"]["NAME"])), "SQLite", "FULL"


class Subjects:
    """The agents each side writes to: the journal's, and the raw driver's own."""

    def __init__(self, db):
        self.journal = C.make_agents(AGENTS)
        self.raw_singles = [RawWriter(db, a) for a in C.make_agents(AGENTS)]
        self.many = C.make_agents(1)[0]
        self.raw_many = RawWriter(db, C.make_agents(1)[0])
        self.raw_8 = RawWriter(db, C.make_agents(1)[0])
        self.raw_same = RawWriter(db, C.make_agents(1)[0])


@dataclass
class Runs:
    """rows/s of every repetition, per case (and the batch sizes the committer formed)."""

    journal_singles: list[float] = field(default_factory=list)
    raw_same_txns: list[float] = field(default_factory=list)
    raw_8_per_txn: list[float] = field(default_factory=list)
    raw_1_per_txn: list[float] = field(default_factory=list)
    journal_many_100: list[float] = field(default_factory=list)
    raw_100_per_txn: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)


def repeat(db, who: Subjects, reps: int, per_thread: int, many_total: int) -> Runs:
    runs = Runs()
    # warm-up (page cache, first connection) — not measured
    many_interleaved(who.many, db, who.raw_many, 200, 100, 0)
    many_seq = 200
    for _ in range(reps):
        batch_sizes: list[int] = []
        runs.journal_singles.append(journal_threads_singles(who.journal, per_thread, batch_sizes))
        runs.batch_sizes.extend(batch_sizes)
        runs.raw_same_txns.append(raw_batched(db, who.raw_same, 0, batch_sizes))
        runs.raw_8_per_txn.append(raw_batched(db, who.raw_8, THREADS * per_thread, THREADS))
        runs.raw_1_per_txn.append(raw_threads_singles(db, who.raw_singles, max(25, per_thread // 3)))  # info only: keep it short
        jm, rm = many_interleaved(who.many, db, who.raw_many, many_total, 100, many_seq)
        many_seq += many_total
        runs.journal_many_100.append(jm)
        runs.raw_100_per_txn.append(rm)
    return runs


def assert_gapless(agent_ids: list[str]) -> None:
    """The journal's transcripts have as many rows as their head seq."""
    from sessions.models import Agent, Event

    for a in agent_ids:
        head = Agent.objects.get(pk=a).last_seq
        n = Event.objects.filter(agent_id=a).count()
        assert head == n, f"{a}: head {head} != {n} rows"


def measure(args, database_url: str | None) -> list[dict]:
    """Every row for one database: SQLite in a temp file, or PostgreSQL at database_url."""
    reps = 3 if args.quick else 5
    per_thread = 150 if args.quick else 300
    many_total = 5000 if args.quick else 10000

    data_dir = C.make_data_dir("append")
    try:
        C.setup_django(data_dir, database_url)
        from django.db import connection

        db, label, durable = pg_raw(database_url) if database_url else sqlite_raw()
        who = Subjects(db)
        runs = repeat(db, who, reps, per_thread, many_total)
        connection.close()
        assert_gapless(who.journal + [who.many])
        connection.close()
        return result_rows(runs, reps, label, durable, "psycopg" if database_url else "sqlite3")
    finally:
        C.cleanup(data_dir)


def listed(xs) -> str:
    return ", ".join(f"{x:,.0f}" for x in xs)


def result_rows(runs: Runs, reps: int, label: str, durable: str, driver: str) -> list[dict]:
    j1, rs, r8, r1 = runs.journal_singles, runs.raw_same_txns, runs.raw_8_per_txn, runs.raw_1_per_txn
    jm_, rm_ = runs.journal_many_100, runs.raw_100_per_txn
    mean_batch = sum(runs.batch_sizes) / len(runs.batch_sizes)
    j1m, rsm, r8m, r1m, jmm, rmm = map(C.median, (j1, rs, r8, r1, jm_, rm_))
    # Ratios are medians of per-repetition ratios (each journal run against
    # the raw run right after it), which cancels most of a noisy disk's drift.
    def ratio(a, b):
        return C.median([x / y for x, y in zip(a, b)])

    return [
        C.row(
            f"append {label}: 8 threads x append(1 fact), {durable}",
            j1m, rsm, ratio(j1, rs), f">= {TARGET}x raw, same txns", ratio(j1, rs) >= TARGET, "rows/s",
            f"medians of {reps}; journal runs {listed(j1)}; committer formed {mean_batch:.1f} rows/commit "
            f"on average; raw {driver} executemany in the same batch sizes: {listed(rs)}",
        ),
        C.row(
            f"append {label}: same, vs raw 8 rows/txn (ideal)",
            j1m, r8m, ratio(j1, r8), "info", "info", "rows/s",
            f"raw {driver} executemany, 8 rows per transaction, one thread: {listed(r8)}",
        ),
        C.row(
            f"append {label}: group commit vs raw 1 row/txn, 8 threads",
            j1m, r1m, ratio(j1, r1), "info (> 1x)", "info", "rows/s",
            f"raw {driver}, 8 threads, one row per transaction: {listed(r1)}",
        ),
        C.row(
            f"append {label}: append_many(100), {durable}",
            jmm, rmm, ratio(jm_, rm_), f">= {TARGET}x raw 100/txn", ratio(jm_, rm_) >= TARGET, "rows/s",
            f"journal runs {listed(jm_)}; raw {driver} 100 rows/txn runs {listed(rm_)}",
        ),
    ]


def main() -> int:
    from bench import _pg

    return _pg.main_sqlite_then_pg(__doc__, Path(__file__).resolve(), measure, "append PostgreSQL: all rows", timeout=300)


if __name__ == "__main__":
    sys.exit(main())
