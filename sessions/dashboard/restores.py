"""What the operator is told about restores, in plain words: the rung's outcome
("rebuilt from the conversation only — files lost"), and, for the tree, the most
severe restore of the last day, so a rebuild is not hidden by the routine
reattach of the next restart. Reattaches are quiet: nothing was lost."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from ..models import Event

RECENT = timedelta(days=1)
# Gentlest first (the restore ladder, docs/DURABILITY.md); lost is the worst.
SEVERITY = {"reattach": 0, "resume": 1, "restart": 2, "restore": 3, "rebuild": 4, "lost": 5}
QUIET = ("reattach",)
clock = timezone.now  # tests move it


def outcome(fact: dict) -> str:
    """One restore fact ({"type", "data"}) as what the operator lost, if anything."""
    data = fact.get("data") if isinstance(fact.get("data"), dict) else {}
    if fact.get("type") == "agent.lost":
        return "lost — it cannot be brought back" + (f" ({data['reason']})" if data.get("reason") else "")
    rung = data.get("rung")
    if rung == "reattach":
        return "reattached — nothing lost"
    if rung == "resume":
        return "resumed its session — a running turn was interrupted"
    if rung == "restart":
        return "restarted its sandbox — disk intact"
    if rung == "restore":
        turn = data.get("checkpoint_turn")
        where = f"the checkpoint of turn {turn}" if turn else "its latest checkpoint"
        return f"restored from {where} — later file changes lost"
    if rung == "rebuild":
        return "rebuilt from the conversation only — files lost"
    return f"recovered ({rung})"


def rung_of(fact: dict) -> str:
    if fact.get("type") == "agent.lost":
        return "lost"
    data = fact.get("data") if isinstance(fact.get("data"), dict) else {}
    return str(data.get("rung") or "")


def notable(agent_ids: list[str]) -> dict[str, dict]:
    """Per agent: the most severe restore of the last day (the latest of equals),
    else its latest restore; none when that is a routine reattach."""
    since = clock() - RECENT
    rows = (Event.objects.filter(agent_id__in=agent_ids, type__in=("agent.restored", "agent.lost"))
            .order_by("agent_id", "seq").values_list("agent_id", "seq", "type", "data", "ts"))
    best: dict[str, tuple] = {}
    for agent_id, seq, etype, data, ts in rows.iterator():
        fact = {"seq": seq, "type": etype, "data": data, "ts": ts}
        fact["rung"] = rung_of(fact)
        key = (ts >= since, SEVERITY.get(fact["rung"], 3) if ts >= since else 0, seq)
        if agent_id not in best or key >= best[agent_id][0]:
            best[agent_id] = (key, fact)
    out = {}
    for agent_id, (_, fact) in best.items():
        if fact["rung"] not in QUIET:
            out[agent_id] = {**fact, "outcome": outcome(fact)}
    return out
