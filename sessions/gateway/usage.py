"""Usage and cost summed from an agent's `model.call` facts, per agent and
per turn (GET /api/agents/{id} "usage"). Read from the journal: the facts are
the truth, this is a fold over them."""

from __future__ import annotations

from sessions.models import Event

TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _empty() -> dict:
    return {"calls": 0, **{k: 0 for k in TOKENS}, "cost_usd": 0.0, "unpriced_calls": 0}


def _add(total: dict, data: dict) -> None:
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
    total, turns = _empty(), {}
    rows = (Event.objects.filter(agent_id=agent_id, type="model.call")
            .order_by("seq").values_list("data", flat=True))
    for data in rows.iterator():
        if not isinstance(data, dict):
            continue
        _add(total, data)
        turn = data.get("turn") if isinstance(data.get("turn"), int) else 0
        _add(turns.setdefault(turn, {"turn": turn, **_empty()}), data)
    return {**total, "turns": [turns[t] for t in sorted(turns)]}


def turn_usage(agent_id: str, turn: int) -> dict:
    """{calls, *_tokens, cost_usd, unpriced_calls} of the calls journaled for
    one turn, for its `turn.finished` / `turn.interrupted` (the relay adds it).
    Read from the agent's latest turn.started on (this turn's, or the one
    before it when the relay has not journaled this one yet): one or two
    turns of rows, never the agent's whole life."""
    since = (Event.objects.filter(agent_id=agent_id, type="turn.started").order_by("-seq")
             .values_list("seq", flat=True).first()) or 0
    total = _empty()
    rows = (Event.objects.filter(agent_id=agent_id, type="model.call", seq__gt=since)
            .order_by("seq").values_list("data", flat=True))
    for data in rows.iterator():
        if isinstance(data, dict) and data.get("turn") == turn:
            _add(total, data)
    return total
