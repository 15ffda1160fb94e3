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
MS = 1000.0  # the rows are in ms, the timings in s


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


def build() -> tuple[str, str, str, float, float]:
    """The three transcripts: a 100-event one for pages, a 1,000-event and a
    100,000-event one for replay (the big one serves pages too). Returns the
    agents (small, 1k, big), the seconds of the big one's snapshot-writing
    replay and of the whole build."""
    from sessions import journal

    small, k1, big = C.make_agents(3)
    t0 = C.now()
    fill(small, 0, SMALL_PAGE)
    build_with_snapshot(k1, SMALL_REPLAY)
    first_scratch = build_with_snapshot(big, BIG)
    build_s = C.now() - t0
    assert journal.head(big) == BIG and journal.head(small) == SMALL_PAGE and journal.head(k1) == SMALL_REPLAY
    return small, k1, big, first_scratch, build_s


def time_pages(big: str, small: str, reps: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """(latest big, latest small, first big, first small) page times, interleaved."""
    from sessions import journal

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
    lb, ls = interleaved(latest(big), latest(small), reps)
    fb, fs = interleaved(first(big), first(small), reps)
    return lb, ls, fb, fs


def time_replays(big: str, k1: str, reps: int, scratch_reps: int) -> tuple[list[float], list[float], list[float]]:
    """(big, 1k) replays from their snapshots, interleaved, and the big one's from scratch."""
    from sessions import journal
    from sessions import state as state_mod

    def rp(agent):
        return lambda: journal.replay(agent, write_snapshot=False)

    assert rp(big)() == state_mod.replay(  # snapshot + tail equals a full fold
        {"seq": e.seq, "type": e.type, "data": e.data, "ts": e.as_dict()["ts"]}
        for e in _all_events(big)
    ), "replay from the snapshot differs from replay from scratch"
    rb, rs = interleaved(rp(big), rp(k1), reps)
    scratch = timed(lambda: journal.replay(big, write_snapshot=False, from_scratch=True), scratch_reps)
    return rb, rs, scratch


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

        assert settings.ALINEO_SNAPSHOT_EVERY <= TAIL, "the tail must be at least one snapshot interval"
        small, k1, big, first_scratch, build_s = build()
        pages = time_pages(big, small, page_reps)
        replays = time_replays(big, k1, replay_reps, scratch_reps)
        connection.close()
        C.emit(page_rows(*pages, page_reps) + replay_rows(*replays, replay_reps, first_scratch, build_s), args)
        return 0
    finally:
        C.cleanup(data_dir)


def page_rows(lb, ls, fb, fs, page_reps: int) -> list[dict]:
    lr, fr = pair_ratio(lb, ls), pair_ratio(fb, fs)
    return [
        C.row(
            "page: latest 100 of 100k vs of 100 events",
            C.median(lb) * MS, C.median(ls) * MS, lr, "<= 1.5x", lr <= 1.5, "ms",
            f"page_before(head+1, 100), medians of {page_reps} alternating pairs; p90 "
            f"{C.pct(lb, 90) * MS:.2f} vs {C.pct(ls, 90) * MS:.2f} ms",
        ),
        C.row(
            "page: first 100 of 100k vs of 100 events",
            C.median(fb) * MS, C.median(fs) * MS, fr, "<= 1.5x", fr <= 1.5, "ms",
            f"page_after(0, 100), medians of {page_reps} alternating pairs; p90 "
            f"{C.pct(fb, 90) * MS:.2f} vs {C.pct(fs, 90) * MS:.2f} ms",
        ),
    ]


def replay_rows(rb, rs, scratch, replay_reps: int, first_scratch: float, build_s: float) -> list[dict]:
    rr = pair_ratio(rb, rs)
    return [
        C.row(
            "replay: 100k vs 1k events (snapshots)",
            C.median(rb) * MS, C.median(rs) * MS, rr, "<= 2x", rr <= 2.0, "ms",
            f"newest snapshot {TAIL} events behind the head on both; median of {replay_reps} interleaved",
        ),
        C.row(
            "replay: 100k from scratch (reference)",
            C.median(scratch) * MS, C.median(rb) * MS, C.median(scratch) / C.median(rb), "info", "info", "ms",
            f"snapshots ignored; runs {', '.join(f'{x * MS:,.0f}' for x in scratch)} ms (+ the snapshot-writing "
            f"build replay of {BIG - TAIL:,}: {first_scratch * MS:,.0f} ms); baseline = replay from the snapshot; "
            f"building the transcripts took {build_s:.1f} s",
        ),
    ]


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
