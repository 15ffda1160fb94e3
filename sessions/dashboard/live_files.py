"""The Files page's "Look at the live home" (sessions/live_home.py): a member
asks for a copy of the RUNNING sandbox's home; the agent's worker takes it
(the web process may not reach the sandbox's engine) and the page, which
reloads itself while the look is pending, then shows it with the same code as
a checkpoint (sessions/dashboard/files.py, ``?live=1``), labelled live, with
its changes against the newest checkpoint. A sandbox that is not running is
never woken: the button is not offered, and a request is refused (409).

POST /agents/{id}/files/live → the files page at ``?live=1&look=<command>``.
"""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from .. import commands, live_home
from ..models import Command, CommandState, LiveHome
from .common import agent_or_404, bad_request, login_required


def newest(agent) -> LiveHome | None:
    return live_home.newest(agent.id)


def look(request, agent) -> dict:
    """The page's look controls: why looking is refused now (None: offered),
    and the state of the look this page was opened for (``look=<command>``)."""
    refused = live_home.refusal_for(agent)
    out = {"look_refused": refused.message if refused else None, "look_cmd": None,
           "look_failed": None}
    raw = request.GET.get("look")
    if raw in (None, ""):
        return out
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise Http404("No such look at the live home.")
    cmd = Command.objects.filter(pk=int(raw), agent=agent, verb="home_snapshot").first()
    if cmd is None:
        raise Http404("No such look at the live home of this agent.")
    out["look_cmd"] = cmd
    if cmd.state == CommandState.FAILED:
        result = cmd.result if isinstance(cmd.result, dict) else {}
        out["look_failed"] = result.get("message") or "the look could not be taken"
    return out


@require_POST
@login_required
def take(request, agent_id: str):
    agent = agent_or_404(request.user, agent_id)
    key = request.headers.get("Idempotency-Key") or request.POST.get("idempotency_key") or None
    try:
        outcome = commands.send(request.user, agent.id, "home_snapshot", {}, key)
    except commands.CommandRefused as exc:
        response = bad_request(request, exc.message)
        response.status_code = exc.status
        return response
    page = reverse("dash-files", kwargs={"agent_id": agent.id})
    return redirect(f"{page}?live=1&look={outcome.body['command']}")
