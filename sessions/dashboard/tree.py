"""The home page: the workspace's agents drawn as a tree, one live list per
workspace. The page and GET /tree render the same fragment, sessions/_tree.html,
each list with its cursor (the tree seq, sessions/dashboard/tree_nodes.py);
alineo.js then follows the workspace's tree stream from there. GET /tree still
answers 204 to the version it was drawn at while nothing changed."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from sandboxes.backends import get_backend

from ..access import workspaces_of
from ..models import ENDED
from .common import login_required, tree_version, visible_agents
from .tree_nodes import node_forms, node_summaries, tree_seq, with_last_activity


def tree_context(user) -> dict:
    version = tree_version(user)  # before the rows: a change in between only redraws
    agents = list(with_last_activity(visible_agents(user)))
    workspaces = list(workspaces_of(user).order_by("id"))
    summaries = node_summaries(agents)
    by_parent: dict[str | None, list] = {}
    for agent in agents:
        by_parent.setdefault(agent.parent_id, []).append(agent)

    def build(parent_id, workspace_id=None):
        return [
            {**summaries[a.id], "children": build(a.id)}
            for a in by_parent.get(parent_id, [])
            if workspace_id is None or a.workspace_id == workspace_id
        ]

    # The cursor from the same rows as the drawing: what is drawn is at least that new.
    trees = [{"id": w.pk, "name": w.name, "tree": build(None, w.pk),
              "cursor": tree_seq(a.last_seq for a in agents if a.workspace_id == w.pk)}
             for w in workspaces]
    return {"workspaces": workspaces, "trees": trees, "version": version,
            "count": len(agents), "archived_count": sum(a.status in ENDED for a in agents),
            **node_forms()}


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
