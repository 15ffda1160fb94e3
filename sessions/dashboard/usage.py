"""GET /usage: model usage and cost of the last N days (1–30, default 7) per
workspace and per agent, from the gateway's ``model.call`` facts (the same
sums as GET /api/agents/{id} "usage", sessions/gateway/usage.py). One query,
on the partial index of model.call rows by time; the workspaces are the
user's own."""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from ..access import workspaces_of
from ..gateway.usage import add_call, empty_usage
from ..models import Event
from .common import login_required

DAYS_DEFAULT, DAYS_MAX = 7, 30
AGENTS_SHOWN = 200


def _days(raw: str | None) -> tuple[int, str]:
    if raw in (None, ""):
        return DAYS_DEFAULT, ""
    if raw.isascii() and raw.isdigit() and 1 <= int(raw[:3]) <= DAYS_MAX and len(raw) <= 3:
        return int(raw), ""
    return DAYS_DEFAULT, f"Days must be a whole number from 1 to {DAYS_MAX}: showing {DAYS_DEFAULT}."


@require_GET
@login_required
def usage(request):
    days, note = _days(request.GET.get("days"))
    workspaces = list(workspaces_of(request.user).order_by("name"))
    since = timezone.now() - timedelta(days=days)
    rows = (Event.objects.filter(type="model.call", ts__gte=since, agent__workspace__in=workspaces)
            .values_list("agent__workspace_id", "agent_id", "agent__spec", "data").iterator(2000))
    by_ws = {w.pk: {"workspace": w, "total": empty_usage(), "agents": {}} for w in workspaces}
    for ws_id, agent_id, spec, data in rows:
        if not isinstance(data, dict):
            continue
        ws = by_ws[ws_id]
        add_call(ws["total"], data)
        name = spec.get("name", "") if isinstance(spec, dict) else ""
        add_call(ws["agents"].setdefault(agent_id, {"id": agent_id, "name": name, **empty_usage()}), data)
    tables = []
    for ws in by_ws.values():
        agents = sorted(ws["agents"].values(), key=lambda a: (-a["cost_usd"], -a["input_tokens"], a["id"]))
        tables.append({**ws, "agents": agents[:AGENTS_SHOWN], "more": max(0, len(agents) - AGENTS_SHOWN)})
    return render(request, "sessions/usage.html", {"tables": tables, "days": days, "note": note,
                                                   "choices": (1, 7, 30)})
