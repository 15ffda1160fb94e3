#!/usr/bin/env python
"""Storage per event: bytes on disk after 1,000 and after 100,000 events of one
agent, on SQLite and on PostgreSQL. Growth must be linear:
bytes at 100k <= 1.1 x 100 x bytes at 1k (the row's ratio is bytes/event at
100k over bytes/event at 1k, target <= 1.1x).

The transcript is a realistic mix, seeded: per turn a `command.prompt`,
`turn.started` and `message.user`, 1-5 steps of coalesced `message.delta`
chunks (~400 chars, as the bridge coalesces them), `message.assistant`,
1-2 `tool.dispatched` / `tool.result` pairs with outputs from a line to
~8 KB (skewed short), then `turn.finished` and `agent.checkpointed`; every
bridge fact carries its `bseq`, as the relay stores it. Each turn is one
`journal.append_many` (the on-disk layout does not depend on how facts are
grouped into transactions). Snapshots are taken as the journal takes them:
`journal.replay(agent)` runs whenever 500 more events (ALINEO_SNAPSHOT_EVERY)
have been appended, so a snapshot is written every ~500 events and the
newest two are kept.

Measured: the bytes the event and snapshot tables (with their indexes, and on
PostgreSQL their TOAST) grew by since just before the agent's first event.
SQLite: dbstat (pages in use; the file's used pages are printed too). No
VACUUM. PostgreSQL: pg_total_relation_size(), no VACUUM (autovacuum may or may
not have run; its dead snapshot rows are printed). One agent, a fresh
database (a temp SQLite file; a scratch database for PostgreSQL, see
bench/_pg.py). Without PostgreSQL its row prints as skipped.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

SMALL = 1_000
BIG = 100_000
TARGET = 1.1
TABLES = ("agent_sessions_event", "agent_sessions_snapshot")

WORDS = tuple(
    "the test fails because journal append returns before commit so we need to check seq order "
    "and replay state from snapshot def class return import self none true false value error "
    "file path line output agent sandbox stream page cursor event data json type turn tool call "
    "result exit code passed failed warning module function index table query row column".split(" ")
)


class Transcript:
    """A seeded, well-formed conversation as the worker journals it."""

    def __init__(self, seed: int = 7):
        self.r = random.Random(seed)
        self.turn = 0
        self.bseq = 0
        self.call = 0

    def text(self, lo: int, hi: int) -> str:
        n = self.r.randint(lo, hi)
        out, size = [], 0
        while size < n:
            w = self.r.choice(WORDS)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)[:n]

    def output(self) -> str:
        # tool output: mostly short, sometimes a screenful, rarely a long log
        k = self.r.random()
        if k < 0.6:
            return self.text(10, 300)
        if k < 0.92:
            return "\n".join(self.text(40, 100) for _ in range(self.r.randint(5, 30)))
        return "\n".join(self.text(60, 120) for _ in range(self.r.randint(40, 90)))

    def b(self, data: dict) -> dict:
        self.bseq += 1
        data["bseq"] = self.bseq
        return data

    def next_turn(self) -> list[tuple[str, dict]]:
        self.turn += 1
        t = self.turn
        prompt = self.text(40, 400)
        facts = [
            ("command.prompt", {"text": prompt, "command": 1000 + t, "by": "bench"}),
            ("turn.started", self.b({"turn": t, "command_id": 1000 + t})),
            ("message.user", self.b({"turn": t, "text": prompt})),
        ]
        for _ in range(self.r.randint(1, 5)):
            reply = self.text(80, 1600)
            for k in range(0, len(reply) - 400, 400):  # coalesced deltas while it streamed
                facts.append(("message.delta", self.b({"turn": t, "text": reply[k:k + 400]})))
            facts.append(("message.assistant", self.b({"turn": t, "text": reply})))
            calls = []
            for _ in range(self.r.randint(1, 2)):
                self.call += 1
                cid = f"call_{self.call:08x}{self.r.getrandbits(32):08x}"
                name = self.r.choice(("shell", "shell", "read_file", "write_file"))
                calls.append((cid, name))
                facts.append(("tool.dispatched", self.b({"turn": t, "tool_call_id": cid, "name": name,
                                                          "input": {"cmd": self.text(10, 120)}})))
            for cid, name in calls:
                facts.append(("tool.result", self.b({"turn": t, "tool_call_id": cid, "name": name,
                                                      "output": self.output(),
                                                      "exit_code": 0 if self.r.random() < 0.85 else 1,
                                                      "is_error": False})))
        final = self.text(40, 600)
        facts.append(("message.assistant", self.b({"turn": t, "text": final})))
        facts.append(("turn.finished", self.b({"turn": t, "text": final})))
        facts.append(("agent.checkpointed", {"checkpoint": t, "turn": t, "bytes": self.r.randint(10**5, 10**7),
                                             "ms": self.r.randint(80, 900), "sandbox_id": "sb-bench"}))
        return facts


def sqlite_bytes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT name, tbl_name FROM sqlite_master WHERE tbl_name IN (%s, %s) AND type IN ('table', 'index')",
                    list(TABLES))
        names = {n: t for n, t in cur.fetchall()}
        marks = ", ".join(["%s"] * len(names))
        cur.execute(f"SELECT name, SUM(pgsize) FROM dbstat WHERE name IN ({marks}) GROUP BY name", list(names))
        by = {n: int(s) for n, s in cur.fetchall()}
        cur.execute("PRAGMA page_count")
        pages = cur.fetchone()[0]
        cur.execute("PRAGMA freelist_count")
        free = cur.fetchone()[0]
        cur.execute("PRAGMA page_size")
        size = cur.fetchone()[0]
    out = {t: sum(v for n, v in by.items() if names[n] == t) for t in TABLES}
    out["event_heap"] = by.get("agent_sessions_event", 0)
    out["file_used"] = (pages - free) * size
    return out


def pg_bytes() -> dict[str, int]:
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for t in TABLES:
            cur.execute("SELECT pg_total_relation_size(%s)", [t])
            out[t] = cur.fetchone()[0]
        cur.execute("SELECT pg_relation_size('agent_sessions_event')")
        out["event_heap"] = cur.fetchone()[0]
        cur.execute("SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = 'agent_sessions_snapshot'")
        row = cur.fetchone()
        out["snapshot_dead"] = row[0] if row else 0
        cur.execute("SELECT pg_database_size(current_database())")
        out["file_used"] = cur.fetchone()[0]
    return out


class Appender:
    """Journals a Transcript turn by turn, stopping exactly at a count, and
    replays (which writes a snapshot) every `every` events, as the journal does."""

    def __init__(self, agent: str, every: int):
        self.agent, self.every = agent, every
        self.transcript = Transcript()
        self.pending: list[tuple[str, dict]] = []
        self.n = self.since_replay = self.payload = 0

    def append_until(self, target: int) -> None:
        from sessions import journal

        while self.n < target:
            if not self.pending:
                self.pending = self.transcript.next_turn()
            batch, self.pending = self.pending[: target - self.n], self.pending[target - self.n:]  # stop exactly at the mark
            journal.append_many(self.agent, batch)
            self.payload += sum(len(t) + len(C.json_text(d)) for t, d in batch)
            self.n += len(batch)
            self.since_replay += len(batch)
            if self.since_replay >= self.every:
                journal.replay(self.agent)  # writes a snapshot, keeps the newest two
                self.since_replay = 0


def settled_growth(sizes, empty: dict[str, int], database_url: str | None) -> dict[str, int]:
    """What the tables grew by since `empty`, measured on a settled database."""
    from django.db import connection

    connection.close()  # the committer's connection too is idle; measure a settled database
    if not database_url:
        with connection.cursor() as cur:
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {k: v - empty.get(k, 0) if k != "snapshot_dead" else v for k, v in sizes().items()}


def grow(agent: str, targets: tuple[int, ...], every: int, database_url: str | None) -> tuple[dict[int, dict], float]:
    """Journal the transcript up to each count in `targets`. Returns what the
    tables had grown by at each, and the seconds the appends took."""
    from sessions.models import Snapshot

    sizes = pg_bytes if database_url else sqlite_bytes
    appender = Appender(agent, every)
    empty = sizes()
    marks: dict[int, dict] = {}
    t0 = C.now()
    for target in targets:
        appender.append_until(target)
        marks[target] = settled_growth(sizes, empty, database_url)
        marks[target]["payload"] = appender.payload
        marks[target]["snapshots"] = Snapshot.objects.filter(agent_id=agent).count()
    return marks, C.now() - t0


def measure(args, database_url: str | None) -> list[dict]:
    data_dir = C.make_data_dir("storage")
    try:
        C.setup_django(data_dir, database_url)
        from django.conf import settings
        from django.db import connection

        from sessions import journal

        big = 20_000 if args.quick else BIG
        agent = C.make_agents(1)[0]
        marks, secs = grow(agent, (SMALL, big), settings.ALINEO_SNAPSHOT_EVERY, database_url)
        assert journal.head(agent) == big
        connection.close()
        return [storage_row(marks, big, secs, database_url)]
    finally:
        C.cleanup(data_dir)


def storage_row(marks: dict[int, dict], big: int, secs: float, database_url: str | None) -> dict:
    def total(m):
        return m["agent_sessions_event"] + m["agent_sessions_snapshot"]

    label = "PostgreSQL" if database_url else "SQLite"
    small_b, big_b = total(marks[SMALL]), total(marks[big])
    per_small, per_big = small_b / SMALL, big_b / big
    ratio = per_big / per_small
    s, b = marks[SMALL], marks[big]
    dead = f"; snapshot dead rows at {big:,}: {b['snapshot_dead']}" if database_url else ""
    note = (f"bytes the event + snapshot tables (indexes{', TOAST' if database_url else ''} included) grew by: "
            f"{small_b:,} at {SMALL:,} events, {big_b:,} at {big:,} (= {big_b / (big / SMALL * small_b):.3f} x "
            f"{big // SMALL} x the 1k figure); of which events {s['agent_sessions_event']:,} / "
            f"{b['agent_sessions_event']:,} (heap {s['event_heap']:,} / {b['event_heap']:,}), snapshots "
            f"{s['agent_sessions_snapshot']:,} / {b['agent_sessions_snapshot']:,} ({s['snapshots']} / "
            f"{b['snapshots']} kept); JSON payload (type + data) {s['payload'] / SMALL:.0f} / "
            f"{b['payload'] / big:.0f} B/event; {'database' if database_url else 'file'} used "
            f"{s['file_used']:,} / {b['file_used']:,} B{dead}; {big:,} events appended in {secs:.1f} s")
    return C.row(f"storage {label}: bytes/event at {big // 1000}k vs 1k events", per_big, per_small, ratio,
                 f"<= {TARGET}x (linear)", ratio <= TARGET, "B", note)


def main() -> int:
    from bench import _pg

    return _pg.main_sqlite_then_pg(__doc__, Path(__file__).resolve(), measure, "storage PostgreSQL: bytes/event", timeout=400)


if __name__ == "__main__":
    sys.exit(main())
