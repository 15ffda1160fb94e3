"""The dashboard. For now: the workspace's agent tree, read-only (the full
operator dashboard is issue 5)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from .api.auth import workspaces_of
from .models import Agent


def _tree(agents):
    by_parent: dict[str | None, list[Agent]] = {}
    for agent in agents:
        by_parent.setdefault(agent.parent_id, []).append(agent)

    def build(parent_id):
        return [{"agent": a, "children": build(a.id)} for a in by_parent.get(parent_id, [])]

    return build(None)


@login_required
def home(request):
    workspaces = list(workspaces_of(request.user))
    agents = Agent.objects.filter(workspace__in=workspaces).order_by("created_at")
    return render(request, "sessions/home.html", {"workspaces": workspaces, "tree": _tree(agents)})
