#!/usr/bin/env python
"""First pages and state rebuild: a 100,000-event transcript against small ones.

Pages (target: big <= 1.5x small), medians of interleaved repetitions:
- latest page: journal.page_before(agent, head + 1, 100)
- first page:  journal.page_after(agent, 0, 100)
  each on a 100,000-event transcript against a 100-event one, in the same
  database (the small agent's rows share the table with the big one's).
  The ratio is the median of per-pair ratios (big and small timed back to
  back, alternating which goes first).

Replay (target: 100,000 events <= 2x 1,000 events):
- journal.replay(agent, write_snapshot=False) with the newest snapshot 500
  events behind the head on both agents — the farthest a snapshot lags when
  replay runs at ALINEO_SNAPSHOT_EVERY=500. Both fold the same 500-event
  tail; what differs is everything the size of the history could leak into
  (finding the snapshot, its size, the tail query).
- for reference, replay from scratch (snapshots ignored) at 100,000 events.

The transcripts are well-formed turns (user message, assistant message, a
tool call and its result), written with append_many in batches of 1,000.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

BIG = 100_000
SMALL_PAGE = 100
SMALL_REPLAY = 1_000
TAIL = 500  # events after the newest snapshot, on both agents
PAGE = 100


def fill(agent_id: str, start: int, n: int, batch: int = 1000) -> None:
    from sessions import journal

    done = 0
    while done < n:
        k = min(batch, n - done)
        journal.append_many(agent_id, C.facts(start + done, k))
        done += k


def build_with_snapshot(agent_id: str, total: int) -> float:
    """Write total events with a snapshot at total - TAIL. Returns the seconds
    the snapshot-writing replay took (a replay from scratch of total - TAIL)."""
    from sessions import journal
    from sessions.models import Snapshot

    fill(agent_id, 0, total - TAIL)
    t0 = C.now()
    journal.replay(agent_id)  # folds everything, writes the snapshot (>= ALINEO_SNAPSHOT_EVERY folded)
    dt = C.now() - t0
    fill(agent_id, total - TAIL, TAIL)
    snap = Snapshot.objects.filter(agent_id=agent_id).order_by("-through_seq").first()
    assert snap is not None and snap.through_seq == total - TAIL, "expected a snapshot TAIL events behind the head"
    return dt


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = C.now()
        fn()
        out.append(C.now() - t0)
    return out


def interleaved(fa, fb, reps: int) -> tuple[list[float], list[float]]:
    """Alternating pairs (a b, b a, a b …), so both sides see the same noise."""
    a, b = [], []
    for i in range(reps):
        if i % 2:
            b += timed(fb, 1)
            a += timed(fa, 1)
        else:
            a += timed(fa, 1)
            b += timed(fb, 1)
    return a, b


def pair_ratio(a: list[float], b: list[float]) -> float:
    """Median of the per-pair ratios: robust to the machine slowing down mid-run."""
    return C.median([x / y for x, y in zip(a, b)])


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    page_reps = 60 if args.quick else 200
    replay_reps = 7 if args.quick else 21
    scratch_reps = 1 if args.quick else 2

    data_dir = C.make_data_dir("pages")
    try:
        C.setup_django(data_dir)
        from django.conf import settings
        from django.db import connection

        from sessions import journal
        from sessions import state as state_mod

        assert settings.ALINEO_SNAPSHOT_EVERY <= TAIL, "the tail must be at least one snapshot interval"
        small, k1, big = C.make_agents(3)
        t0 = C.now()
        fill(small, 0, SMALL_PAGE)
        build_with_snapshot(k1, SMALL_REPLAY)
        first_scratch = build_with_snapshot(big, BIG)
        build_s = C.now() - t0
        assert journal.head(big) == BIG and journal.head(small) == SMALL_PAGE and journal.head(k1) == SMALL_REPLAY

        # --- pages
        def latest(agent):
            h = journal.head(agent)
            return lambda: journal.page_before(agent, h + 1, PAGE)

        def first(agent):
            return lambda: journal.page_after(agent, 0, PAGE)

        # correctness of what we time
        p = journal.page_before(big, BIG + 1, PAGE)
        assert [e.seq for e in p.events] == list(range(BIG - PAGE + 1, BIG + 1))
        p = journal.page_after(big, 0, PAGE)
        assert [e.seq for e in p.events] == list(range(1, PAGE + 1)) and p.has_more

        timed(latest(big), 20), timed(latest(small), 20)  # warm the page cache
        lb, ls = interleaved(latest(big), latest(small), page_reps)
        fb, fs = interleaved(first(big), first(small), page_reps)

        # --- replay
        def rp(agent):
            return lambda: journal.replay(agent, write_snapshot=False)

        assert rp(big)() == state_mod.replay(  # snapshot + tail equals a full fold
            {"seq": e.seq, "type": e.type, "data": e.data, "ts": e.as_dict()["ts"]}
            for e in _all_events(big)
        ), "replay from the snapshot differs from replay from scratch"
        rb, rs = interleaved(rp(big), rp(k1), replay_reps)

        original = journal._newest_snapshot
        journal._newest_snapshot = lambda agent_id, through: (0, state_mod.initial_state())
        try:
            scratch = timed(rp(big), scratch_reps)
        finally:
            journal._newest_snapshot = original
        connection.close()

        ms = 1000.0
        lr, fr, rr = pair_ratio(lb, ls), pair_ratio(fb, fs), pair_ratio(rb, rs)
        rows = [
            C.row(
                "page: latest 100 of 100k vs of 100 events",
                C.median(lb) * ms, C.median(ls) * ms, lr, "<= 1.5x", lr <= 1.5, "ms",
                f"page_before(head+1, 100), medians of {page_reps} alternating pairs; p90 "
                f"{C.pct(lb, 90) * ms:.2f} vs {C.pct(ls, 90) * ms:.2f} ms",
            ),
            C.row(
                "page: first 100 of 100k vs of 100 events",
                C.median(fb) * ms, C.median(fs) * ms, fr, "<= 1.5x", fr <= 1.5, "ms",
                f"page_after(0, 100), medians of {page_reps} alternating pairs; p90 "
                f"{C.pct(fb, 90) * ms:.2f} vs {C.pct(fs, 90) * ms:.2f} ms",
            ),
            C.row(
                "replay: 100k vs 1k events (snapshots)",
                C.median(rb) * ms, C.median(rs) * ms, rr, "<= 2x", rr <= 2.0, "ms",
                f"newest snapshot {TAIL} events behind the head on both; median of {replay_reps} interleaved",
            ),
            C.row(
                "replay: 100k from scratch (reference)",
                C.median(scratch) * ms, C.median(rb) * ms, C.median(scratch) / C.median(rb), "info", "info", "ms",
                f"snapshots ignored; runs {', '.join(f'{x * ms:,.0f}' for x in scratch)} ms (+ the snapshot-writing "
                f"build replay of {BIG - TAIL:,}: {first_scratch * ms:,.0f} ms); baseline = replay from the snapshot; "
                f"building the transcripts took {build_s:.1f} s",
            ),
        ]
        C.emit(rows, args)
        return 0
    finally:
        C.cleanup(data_dir)


def _all_events(agent_id):
    from sessions import journal

    after = 0
    while True:
        page = journal.page_after(agent_id, after, 1000)
        yield from page.events
        if not page.has_more:
            return
        after = page.last_seq


if __name__ == "__main__":
    sys.exit(main())
