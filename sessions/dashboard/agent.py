"""The agent page: the latest page of the transcript rendered with its cursor,
older pages on scroll (?before=), newer rows by cursor (?after=) — both as the
same fragment, sessions/_event_rows.html, keyed by seq (id="row-<seq>")."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from .. import approvals, inputs, journal
from ..access import AGENT_ID, may_approve
from ..gateway import budget
from ..gateway.usage import agent_usage
from ..models import Agent, AgentLease, Event
from ..templatetags.alineo import event_view
from . import restores
from . import transcript
from .actions import action_forms
from .common import agent_or_404, agent_version, bad_request, login_required, summarize

FIRST_PAGE = 100
OLDER_PAGE = 300
NEWER_PAGE = 500
HISTORY = 20
USAGE_TURNS = 10
INHERITED = 200
CONVERSATION = ("message.user", "message.assistant", "steer.delivered")


def side_context(agent) -> dict:
    """The side panel: restore history and live checkpoints."""
    facts = list(
        Event.objects.filter(agent=agent, type__in=("agent.restored", "agent.lost"))
        .order_by("-seq")
        .values_list("seq", "type", "data", "ts")[:HISTORY]
    )
    now = timezone.now()
    days = agent.workspace.checkpoint_max_age_days
    checkpoints = [c for c in agent.checkpoints.filter(deleted_at=None).order_by("-created_at")
                   [:HISTORY] if c.expires_under(days) > now]  # what a restore could still use
    usage = agent_usage(agent.id)
    ws = agent.workspace
    has_budget = ws.budget_tokens_per_day is not None or ws.budget_usd_per_day is not None
    return {
        "restores": [_restore(s, t, d, ts) for s, t, d, ts in facts],
        "checkpoints": checkpoints,
        "usage": usage,
        "usage_turns": usage["turns"][-USAGE_TURNS:][::-1],  # newest first
        "budget": budget.summary(ws) if has_budget else None,
        "fork": fork_origin(agent),
    }


def fork_origin(agent) -> dict | None:
    """Where a fork came from, as its first fact records it (sessions/commands/fork.py)."""
    data = Event.objects.filter(agent=agent, seq=1).values_list("data", flat=True).first()
    origin = data.get("fork") if isinstance(data, dict) else None
    if not isinstance(origin, dict) or not AGENT_ID.fullmatch(str(origin.get("agent"))):
        return None  # else {% url %} would raise
    through = origin.get("through_seq") if origin.get("checkpoint") else origin.get("at_event")
    return {**origin, "through": through if isinstance(through, int) else 0}


def inherited(agent, origin: dict | None) -> dict | None:
    """The conversation a fork started with: its source's messages through the
    fork point (the latest INHERITED of them), read from the source's transcript."""
    if not origin or not origin["through"]:
        return None
    source = Agent.objects.filter(pk=origin["agent"], workspace=agent.workspace_id).first()
    if source is None:
        return None
    rows = list(Event.objects.filter(agent=source, seq__lte=origin["through"],
                                     type__in=CONVERSATION).order_by("-seq")[:INHERITED])
    return {"source": source, "messages": [
        {"seq": e.seq, "who": "You" if e.type != "message.assistant" else "Assistant",
         "steer": e.type == "steer.delivered",
         "text": str((e.data or {}).get("text", "")) if isinstance(e.data, dict) else ""}
        for e in reversed(rows)], "cut": len(rows) == INHERITED}


def _restore(seq, etype, data, ts) -> dict:
    fact = {"seq": seq, "type": etype, "data": data, "ts": ts}
    return {**fact, "rung": restores.rung_of(fact), "outcome": restores.outcome(fact)}


def agent_context(agent, user) -> dict:
    info = summarize(agent)
    children = list(agent.children.order_by("created_at", "id"))
    # The header follows the tree's rule: the most severe restore of the last day, not the latest.
    return {**info, **side_context(agent), "children": children, "version": agent_version(agent),
            "restore": restores.notable([agent.id]).get(agent.id),
            "worker": _driving_worker(agent), "approval": _approval(agent, user)}


def _approval(agent, user) -> dict | None:
    """The held credentials the agent waits for, and whether this user may approve them."""
    state = approvals.state_of(agent)
    if not state.waiting:
        return None
    return {"missing": state.missing, "reason": (state.requested or {}).get("reason", ""),
            "may_approve": may_approve(user)}


def _driving_worker(agent) -> str | None:
    """The worker whose lease on the agent is live now (docs/DEPLOYMENT.md), if any."""
    return (AgentLease.objects.filter(agent=agent, expires_at__gt=timezone.now())
            .values_list("holder", flat=True).first())


@require_GET
@login_required
def agent_page(request, agent_id: str):
    agent = agent_or_404(request.user, agent_id)
    page = journal.page_before(agent.id, agent.last_seq + 1, FIRST_PAGE)
    info = agent_context(agent, request.user)
    context = {
        **info,
        **action_forms(),
        "inherited": inherited(agent, info["fork"]),
        "events": page.events,
        "rows": transcript.rows(agent.id, page.events, event_view),
        "cursor": page.last_seq or 0,
        "first": page.first_seq or 0,
        "has_older": page.has_more,
    }
    return render(request, "sessions/agent.html", context)


@require_GET
@login_required
def agent_live(request, agent_id: str):
    """The status header and side panel, polled: 204 while nothing changed."""
    agent = agent_or_404(request.user, agent_id)
    if request.GET.get("v") == agent_version(agent):
        return HttpResponse(status=204)
    return render(request, "sessions/_agent_live.html",
                  {**agent_context(agent, request.user), **action_forms()})


@require_GET
@login_required
def agent_rows(request, agent_id: str):
    """Rows after a cursor (live catch-up) or before one (scroll-up). The cursor
    the client continues from comes back in headers, next to the same fragment
    the page was drawn with."""
    agent = agent_or_404(request.user, agent_id)
    after, before = inputs.cursor(request.GET.get("after")), inputs.cursor(request.GET.get("before"))
    if (after is None) == (before is None):
        return bad_request(request, "Give after=<seq> or before=<seq>, one of them, as a "
                                    "non-negative integer in the digits 0-9.")
    if before is not None:
        page = journal.page_before(agent.id, before, OLDER_PAGE)
    else:
        page = journal.page_after(agent.id, after, NEWER_PAGE)
    response = render(request, "sessions/_event_rows.html",
                      {"agent": agent, "rows": transcript.rows(agent.id, page.events, event_view,
                                               after_screen=after is not None)})
    response["X-Alineo-First"] = str(page.first_seq or 0)
    response["X-Alineo-Last"] = str(page.last_seq or 0)
    response["X-Alineo-Has-More"] = "1" if page.has_more else "0"
    response["X-Alineo-Head"] = str(page.head)
    response["Cache-Control"] = "no-store"
    return response
