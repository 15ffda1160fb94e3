"""One rule for the bridge's numbers in a transcript, shared by the
integration soundness helpers and the fault invariants: each bridge event
(``bseq``) journaled once, in order, and with no gap — a gap is an event the
control plane never journaled, which the contract allows only on the record
(``bridge.events_lost``, and then it is still reported here as trouble).

A new count starts where the transcript says so: ``bridge.session_changed``
(the next bseq is 1), ``bridge.cursor_reset`` (the next is ``to`` + 1) and a
fresh-sandbox ``agent.restored`` (restore / rebuild: the next is whatever the
new bridge hands out first)."""

from __future__ import annotations

FRESH_RUNGS = ("restore", "rebuild")


def bseq_trouble(events: list[dict], *, lost_ok: bool = False) -> list[str]:
    """What is wrong with the bseqs of `events` (an agent's transcript), as
    short sentences; empty when every bridge event is there once, in order."""
    out: list[str] = []
    expected: int | None = None  # None: the next bseq may start a count
    for e in events:
        t, d = e["type"], e["data"]
        if t == "bridge.session_changed":
            expected = 1
        elif t == "bridge.cursor_reset":
            expected = int(d.get("to") or 0) + 1
        elif t == "agent.restored" and d.get("rung") in FRESH_RUNGS:
            expected = None
        elif t == "bridge.events_lost":
            if not lost_ok:
                out.append(f"bridge events were lost: seq {e['seq']} {d}")
            expected = int(d.get("through") or 0) + 1
        elif "bseq" in d:
            b = d["bseq"]
            if expected is not None and b != expected:
                kind = "twice" if b < expected else "with a gap"
                out.append(f"bridge event bseq {b} journaled {kind}: bseq {expected} was next "
                           f"(seq {e['seq']}, {t})")
            expected = b + 1
    return out
