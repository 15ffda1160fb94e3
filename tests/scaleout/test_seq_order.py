"""seq on PostgreSQL with 8 concurrent writers on ONE agent: 1..N with no gaps,
each append contiguous, and commit order equal to seq order.

Commit order is read two ways:
- PostgreSQL's own commit timestamps (track_commit_timestamp, on in the
  cluster .ci/services-up starts): pg_xact_commit_timestamp(xmin) of the rows
  must not decrease along seq, and each transaction's rows must be contiguous;
- an observer that keeps reading the transcript while the writers run: every
  snapshot it takes must be a gapless prefix 1..k (a later seq never becomes
  visible before an earlier one — what a stream reading "after my cursor" needs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections, transaction

from sessions import journal
from sessions.models import Agent, Event
from tests.engines import database_env

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 8
ROUNDS = 40  # per writer; every third round appends 3 facts in one append_many

# A writer process: the journal's group committer, its own connection, its own
# transactions. Waits for the `go` file so all eight start together.
WRITER = r"""
import json, os, sys, time
import django
django.setup()
from sessions import journal
agent_id, w, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
out = []
for i in range(rounds):
    if i % 3 == 2:
        recs = journal.append_many(agent_id, [("t.w", {"w": w, "i": i, "k": k}) for k in range(3)])
    else:
        recs = [journal.append(agent_id, "t.w", {"w": w, "i": i, "k": 0})]
    out.append([r.seq for r in recs])
print(json.dumps(out), flush=True)
"""


def _facts_per_writer() -> int:
    return sum(3 if i % 3 == 2 else 1 for i in range(ROUNDS))


class Observer(threading.Thread):
    """Reads the agent's seqs over and over (each read is one snapshot)."""

    def __init__(self, agent_id: str):
        super().__init__(daemon=True)
        self.agent_id = agent_id
        self.stop = threading.Event()
        self.reads = 0
        self.heads: list[int] = []
        self.bad: list[str] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                with transaction.atomic():
                    with connection.cursor() as cur:
                        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        cur.execute(f"SELECT seq FROM {Event._meta.db_table} WHERE agent_id = %s ORDER BY seq",
                                    [self.agent_id])
                        seqs = [row[0] for row in cur.fetchall()]
                        cur.execute(f"SELECT last_seq FROM {Agent._meta.db_table} WHERE id = %s",
                                    [self.agent_id])
                        head = cur.fetchone()[0]
                self.reads += 1
                if seqs != list(range(1, len(seqs) + 1)):
                    missing = sorted(set(range(1, (seqs[-1] if seqs else 0) + 1)) - set(seqs))
                    self.bad.append(f"snapshot of {len(seqs)} rows has gaps at {missing[:10]}")
                if head != len(seqs):
                    self.bad.append(f"head {head} but {len(seqs)} rows in the same snapshot")
                if self.heads and len(seqs) < self.heads[-1]:
                    self.bad.append(f"the transcript shrank from {self.heads[-1]} to {len(seqs)}")
                self.heads.append(len(seqs))
                time.sleep(0.001)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.bad.append(f"observer failed: {exc!r}")
        finally:
            connection.close()


def _check_transcript(agent_id: str, total: int) -> None:
    seqs = list(Event.objects.filter(agent_id=agent_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, total + 1)), "seq has gaps or duplicates"
    assert Agent.objects.get(pk=agent_id).last_seq == total

    with connection.cursor() as cur:
        cur.execute("SHOW track_commit_timestamp")
        tracked = cur.fetchone()[0] == "on"
        cur.execute(
            f"SELECT seq, xmin::text, {'pg_xact_commit_timestamp(xmin)' if tracked else 'NULL'} "
            f"FROM {Event._meta.db_table} WHERE agent_id = %s ORDER BY seq", [agent_id])
        rows = cur.fetchall()
    # Each transaction's rows are contiguous in seq …
    seen, previous = set(), None
    for _, xid, _ in rows:
        if xid != previous:
            assert xid not in seen, f"transaction {xid} wrote non-contiguous seqs"
            seen.add(xid)
            previous = xid
    # … and the transactions committed in seq order.
    if tracked:
        stamps = [stamp for _, _, stamp in rows]
        late = [(rows[i][0], rows[i + 1][0]) for i in range(len(rows) - 1) if stamps[i + 1] < stamps[i]]
        assert not late, f"commit order differs from seq order at seqs {late[:5]}"
    else:  # a cluster of your own without it: the observer's check still holds
        print("track_commit_timestamp is off: commit timestamps not compared")


def test_eight_writer_processes_get_gapless_seqs_in_commit_order(agent, tmp_path):
    go = tmp_path / "go"
    env = database_env({**os.environ, "DJANGO_SETTINGS_MODULE": "alineo_site.settings"})
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, agent.id, str(w), str(ROUNDS), str(go)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(WRITERS)
    ]
    observer = Observer(agent.id)
    try:
        for proc in procs:  # every writer has set Django up and waits
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
        observer.start()
        go.write_text("go")
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        observer.stop.set()
        observer.join(30)

    total = WRITERS * _facts_per_writer()
    _check_transcript(agent.id, total)
    # What each writer was told matches what is stored: its appends in its own
    # order, each append_many contiguous.
    stored = {seq: data for seq, data in Event.objects.filter(agent_id=agent.id).values_list("seq", "data")}
    for w, appends in enumerate(outputs):
        flat = [seq for seqs in appends for seq in seqs]
        assert flat == sorted(flat), f"writer {w}: its appends got seqs out of its own order"
        for seqs in appends:
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert all(stored[s]["w"] == w for s in seqs)
    interleaved = sum(1 for a, b in zip(range(1, total), range(2, total + 1)) if stored[a]["w"] != stored[b]["w"])
    assert interleaved > WRITERS, "the writers did not run concurrently; the test proved nothing"
    assert observer.reads > 5 and not observer.bad, observer.bad[:5]


def _thread_writers(agent_id: str) -> tuple[dict[int, list[list[int]]], Observer]:
    barrier = threading.Barrier(WRITERS)
    results: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            barrier.wait(30)
            out = []
            for i in range(ROUNDS):
                n = 3 if i % 3 == 2 else 1
                with transaction.atomic():
                    recs = journal.append_many(agent_id, [("t.w", {"w": w, "i": i, "k": k}) for k in range(n)])
                out.append([r.seq for r in recs])
            results[w] = out
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    observer = Observer(agent_id)
    observer.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    observer.stop.set()
    observer.join(30)
    assert not errors, errors[:3]
    return results, observer


def test_eight_writer_threads_in_their_own_transactions(agent):
    """The other path of the journal: appends inside a caller's transaction
    (as commands do) — eight threads, eight connections, no group commit."""
    results, observer = _thread_writers(agent.id)
    total = WRITERS * _facts_per_writer()
    _check_transcript(agent.id, total)
    for w, appends in results.items():
        flat = [seq for seqs in appends for seq in seqs]
        assert flat == sorted(flat) and all(s == list(range(s[0], s[0] + len(s))) for s in appends)
    assert not observer.bad, observer.bad[:5]


def test_ts_never_goes_back_along_seq(agent):
    """`ts` is the commit time (docs/API.md): a client that orders by it must
    get seq order, also when writers contend for the agent."""
    _thread_writers(agent.id)
    stamps = list(Event.objects.filter(agent_id=agent.id).order_by("seq").values_list("seq", "ts"))
    back = [(a[0], b[0]) for a, b in zip(stamps, stamps[1:]) if b[1] < a[1]]
    assert not back, f"{len(back)} of {len(stamps)} events have a ts earlier than the one before: {back[:5]}"
