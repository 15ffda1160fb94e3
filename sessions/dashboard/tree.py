"""The home page: the workspace's agents drawn as a tree. The page and its
live poll render the same fragment, sessions/_tree.html; the poll carries the
version it was drawn at and gets a 204 while nothing changed."""

from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from sandboxes.backends import get_backend

from ..access import workspaces_of
from ..forms import TextCommandForm
from ..models import Event
from . import restores
from .common import login_required, summarize, tree_version, visible_agents


def tree_context(user) -> dict:
    version = tree_version(user)  # before the rows: a change in between only re-polls
    last_ts = Event.objects.filter(agent=OuterRef("pk"), seq=OuterRef("last_seq")).values("ts")[:1]
    agents = list(visible_agents(user).annotate(last_ts=Subquery(last_ts)))
    by_parent: dict[str | None, list] = {}
    for agent in agents:
        by_parent.setdefault(agent.parent_id, []).append(agent)

    origins = fork_origins([a.id for a in agents])
    notable = restores.notable([a.id for a in agents])

    def build(parent_id):
        return [
            {**summarize(a), "forked_from": origins.get(a.id), "restore": notable.get(a.id),
             "last_activity": a.last_ts or a.created_at, "children": build(a.id)}
            for a in by_parent.get(parent_id, [])
        ]

    return {
        "workspaces": list(workspaces_of(user)),
        "tree": build(None),
        "version": version,
        "count": len(agents),
        **node_forms(),
    }


def fork_origins(agent_ids: list[str]) -> dict[str, dict]:
    """Where each forked agent came from (its first fact says), by agent id."""
    rows = Event.objects.filter(agent_id__in=agent_ids, seq=1, type="agent.spawned").values_list(
        "agent_id", "data")
    return {agent_id: data["fork"] for agent_id, data in rows if (data or {}).get("fork")}


def sandbox_notice() -> str | None:
    """What the tree page says above the agents when agents cannot be isolated
    or cannot be spawned at all (sessions/checks.py W006, W007 say it too)."""
    backend = get_backend()
    reason = backend.unavailable_reason()
    if reason:
        return f"Agents cannot be spawned here: {reason}."
    if not backend.isolated:
        return ("Agents run UNISOLATED (ALINEO_SANDBOX=unisolated): as this server's user, "
                "with its files and network. For development only.")
    return None


@require_GET
@login_required
def home(request):
    return render(request, "sessions/home.html",
                  {**tree_context(request.user), "sandbox_notice": sandbox_notice()})


@require_GET
@login_required
def tree_fragment(request):
    if request.GET.get("v") == tree_version(request.user):
        return HttpResponse(status=204)
    return render(request, "sessions/_tree.html", tree_context(request.user))


def node_forms() -> dict:
    return {"prompt_form": TextCommandForm("prompt"), "steer_form": TextCommandForm("steer")}
