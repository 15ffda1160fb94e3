"""Usage and cost summed from an agent's `model.call` facts, per agent and
per turn (GET /api/agents/{id} "usage"). Read from the journal: the facts are
the truth, this is a fold over them."""

from __future__ import annotations

from sessions.models import Event

TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def empty_usage() -> dict:
    return {"calls": 0, **{k: 0 for k in TOKENS}, "cost_usd": 0.0, "unpriced_calls": 0}


def add_call(total: dict, data: dict) -> None:
    """Add one model.call fact's usage and cost to `total` (an empty_usage())."""
    total["calls"] += 1
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    for key in TOKENS:
        value = usage.get(key)
        total[key] += value if isinstance(value, int) and not isinstance(value, bool) else 0
    cost = data.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        total["cost_usd"] = round(total["cost_usd"] + cost, 8)
    else:
        total["unpriced_calls"] += 1


def agent_usage(agent_id: str) -> dict:
    """{calls, *_tokens, cost_usd, unpriced_calls, turns: [{turn, …}]} of the
    calls the gateway made for the agent (replays cost nothing: not counted)."""
    total, turns = empty_usage(), {}
    rows = (Event.objects.filter(agent_id=agent_id, type="model.call")
            .order_by("seq").values_list("data", flat=True))
    for data in rows.iterator():
        if not isinstance(data, dict):
            continue
        add_call(total, data)
        turn = data.get("turn") if isinstance(data.get("turn"), int) else 0
        add_call(turns.setdefault(turn, {"turn": turn, **empty_usage()}), data)
    return {**total, "turns": [turns[t] for t in sorted(turns)]}


def turn_usage(agent_id: str, turn: int) -> dict:
    """{calls, *_tokens, cost_usd, unpriced_calls} of the calls journaled for
    one turn, for its `turn.finished` / `turn.interrupted` (the relay adds it).
    Read from the agent's latest turn.started on (this turn's, or the one
    before it when the relay has not journaled this one yet): one or two
    turns of rows, never the agent's whole life."""
    since = (Event.objects.filter(agent_id=agent_id, type="turn.started").order_by("-seq")
             .values_list("seq", flat=True).first()) or 0
    total = empty_usage()
    rows = (Event.objects.filter(agent_id=agent_id, type="model.call", seq__gt=since)
            .order_by("seq").values_list("data", flat=True))
    for data in rows.iterator():
        if isinstance(data, dict) and data.get("turn") == turn:
            add_call(total, data)
    return total


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_line(usage) -> str:
    """One turn's usage as its block says it ("2 model calls · 120 in / 40 out tokens ·
    $0.000300"), from the sum its turn.finished carries; "" when it made no call."""
    if not isinstance(usage, dict) or not _count(usage.get("calls")):
        return ""
    calls = _count(usage.get("calls"))
    parts = [f"{calls} model call{'s' if calls != 1 else ''}",
             f"{_count(usage.get('input_tokens'))} in / {_count(usage.get('output_tokens'))} out tokens"]
    cost = usage.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0:
        parts.append(f"${cost:.6f}")
    if _count(usage.get("unpriced_calls")):
        parts.append(f"{_count(usage['unpriced_calls'])} without a price")
    return " · ".join(parts)
