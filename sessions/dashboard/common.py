"""What every dashboard view shares: login (also for fragments), workspace
scoping, and the per-agent summary the tree and the agent page both show."""

from __future__ import annotations

import hashlib
from functools import wraps
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpResponse
from django.contrib import messages
from django.shortcuts import redirect, render

from .. import journal
from ..access import visible_agent, workspaces_of
from ..models import ENDED, Agent, AgentStatus


def _is_fragment(request) -> bool:
    return bool(getattr(request, "htmx", False)) or request.headers.get("X-Alineo-Fragment") == "1"


def login_required(view):
    """Like Django's, but a fragment request (htmx or alineo.js) gets a 401 with
    HX-Redirect to the login page and back to the page it was drawn on."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if not _is_fragment(request):
            return redirect_to_login(request.get_full_path())
        back = _page_of(request.headers.get("HX-Current-URL") or "/")
        response = HttpResponse("Your session has ended; log in again.", status=401)
        response["HX-Redirect"] = f"{settings.LOGIN_URL}?next={quote(back)}"
        return response

    return wrapped


def _page_of(url: str) -> str:
    """The path and query of the page a fragment was drawn on ("/" when the
    header is not a URL: urlsplit raises ValueError on "http://[")."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "/"
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def bad_request(request, message: str) -> HttpResponse:
    """The readable 400 page (templates/400.html) for a request the dashboard refuses."""
    return render(request, "400.html", {"message": message}, status=400)


def open_new_agent(request, outcome, done: str, again: str):
    """After a spawn or a fork: say so (or that this click had already done it),
    then open the new agent's page."""
    agent_id = outcome.body["id"]
    if outcome.replayed:
        messages.info(request, f"{again} {agent_id} for this click.")
    else:
        messages.success(request, f"{done} {agent_id}.")
    return redirect("dash-agent", agent_id=agent_id)


def agent_or_404(user, agent_id: str) -> Agent:
    """The agent if the user may see it; another workspace's agent is a 404 too."""
    agent = visible_agent(user, agent_id)
    if agent is None:
        raise Http404("No such agent.")
    return agent


def summarize(agent: Agent) -> dict:
    """Status and the running turn's progress of one agent (its notable restore:
    restores.notable, for many agents at once)."""
    status, reason = journal.effective_status(agent)
    info = {"agent": agent, "status": status, "reason": reason, "turn": None,
            "turns": None, "ended": status in ENDED}
    if agent.last_seq == 0:
        return info
    try:
        state = journal.replay(agent.id)
    except journal.Unrecoverable as exc:
        info.update(status=AgentStatus.UNRECOVERABLE.value, reason=str(exc), ended=True)
        return info
    info.update(turn=state.get("current_turn"), turns=state.get("turns"))
    return info


def visible_agents(user):
    return (
        Agent.objects.filter(workspace__in=workspaces_of(user))
        .select_related("workspace")
        .order_by("created_at", "id")
    )


def version_of(rows) -> str:
    """A short digest of what a live fragment shows: unchanged digest → 204."""
    text = "|".join(f"{r[0]}:{r[1]}:{r[2]}:{r[3]}" for r in rows)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def tree_version(user) -> str:
    rows = visible_agents(user).values_list("id", "last_seq", "status", "updated_at")
    return version_of(rows)


def agent_version(agent: Agent) -> str:
    checkpoints = agent.checkpoints.filter(deleted_at=None).count()
    status, _ = journal.effective_status(agent)
    return version_of([(agent.id, agent.last_seq, status, checkpoints)])
