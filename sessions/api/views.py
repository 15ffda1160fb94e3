"""The JSON API. Views only read: every write goes through
sessions.commands (idempotent, one transaction) and every event read through
sessions.journal. The SSE stream is routed in asgi.py, before Django."""

from __future__ import annotations

import re
from functools import partial
from typing import Callable

from django.conf import settings
from django.db.models import Q
from django.http import JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from .. import commands, journal, live_home
from ..access import visible_agent
from ..gateway.usage import agent_usage
from ..models import Agent, AgentStatus, Checkpoint, Command, Event, LiveHome, iso_ts
from .errors import ApiError, error_response, not_found
from .handler import api_view, idempotency_key, json_body, outcome_response, query_int

_AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def _agent(user, agent_id: str) -> Agent:
    """The agent if the user may see it; another workspace's agent is a 404 too."""
    agent = visible_agent(user, agent_id) if _AGENT_ID.fullmatch(agent_id) else None
    if agent is None:
        raise not_found("agent")
    return agent


def _summary(agent: Agent, children: list[str]) -> dict:
    status, reason = journal.effective_status(agent)
    return {
        "id": agent.id,
        "name": agent.spec.get("name", "") if isinstance(agent.spec, dict) else "",
        "status": status,
        "status_reason": reason,
        "sandbox_id": agent.sandbox_id or None,
        "sandbox_host": agent.sandbox_host or None,  # the engine that holds it (DEPLOYMENT.md)
        "parent": agent.parent_id,
        "children": children,
        "last_seq": agent.last_seq,
        "created_at": iso_ts(agent.created_at),
    }


def _children_of(ids: list[str]) -> dict[str, list[str]]:
    """Children ids for each agent in one query (the tree without N+1)."""
    out: dict[str, list[str]] = {i: [] for i in ids}
    rows = (
        Agent.objects.filter(parent_id__in=ids)
        .order_by("created_at", "id")
        .values_list("parent_id", "id")
    )
    for parent_id, child_id in rows:
        out[parent_id].append(child_id)
    return out


# --- /api/agents -------------------------------------------------------------------


@api_view("GET", "POST")
def agents(request, user):
    if request.method == "POST":
        return outcome_response(commands.spawn(user, json_body(request), idempotency_key(request)))
    return _agent_list(request, user)


def _agent_list(request, user) -> JsonResponse:
    """A page of the user's agents, oldest first; `?after=<agent id>` continues a page."""
    limit = query_int(request, "limit", minimum=1, maximum=settings.ALINEO_PAGE_LIMIT_MAX)
    limit = limit or settings.ALINEO_PAGE_LIMIT_DEFAULT
    rows = Agent.objects.filter(workspace__members=user).order_by("created_at", "id")
    after = request.GET.get("after")
    if after is not None:
        cursor = visible_agent(user, after) if _AGENT_ID.fullmatch(after) else None
        if cursor is None:
            raise ApiError(400, "after.invalid", "after must be the id of an agent you can see.")
        rows = rows.filter(
            Q(created_at__gt=cursor.created_at) | Q(created_at=cursor.created_at, id__gt=cursor.id)
        )
    page = list(rows[: limit + 1])
    has_more, page = len(page) > limit, page[:limit]
    children = _children_of([a.id for a in page])
    return JsonResponse(
        {
            "agents": [_summary(a, children[a.id]) for a in page],
            "has_more": has_more,
            "next_after": page[-1].id if page else after,
        }
    )


@api_view("GET")
def agent_detail(request, user, agent_id: str):
    agent = _agent(user, agent_id)
    body = _summary(agent, _children_of([agent.id])[agent.id])
    body["spec"] = agent.spec
    body["workspace"] = agent.workspace.name
    spawned = (Event.objects.filter(agent=agent, seq=1, type="agent.spawned")
               .values_list("data", flat=True).first()) or {}
    body["forked_from"] = spawned.get("fork")
    try:
        state = journal.replay(agent.id)
    except journal.Unrecoverable as exc:
        # replay() has marked the agent; show it as it now is rather than fail the page.
        body.update(
            status=AgentStatus.UNRECOVERABLE.value,
            status_reason=str(exc),
            current_turn=None,
            turns=None,
        )
        return JsonResponse(body)
    body.update(current_turn=state["current_turn"], turns=state["turns"],
                usage=agent_usage(agent.id))
    return JsonResponse(body)


# --- commands ------------------------------------------------------------------------


@api_view("POST")
def agent_command(request, user, agent_id: str, verb: str):
    agent = _agent(user, agent_id)
    outcome = commands.send(user, agent.id, verb, json_body(request), idempotency_key(request))
    return outcome_response(outcome)


@api_view("POST")
def agent_approve(request, user, agent_id: str):
    """Approve held credential bindings for the agent's next sandbox start."""
    agent = _agent(user, agent_id)
    outcome = commands.approve(user, agent.id, json_body(request), idempotency_key(request))
    return outcome_response(outcome)


@api_view("POST")
def agent_deny(request, user, agent_id: str):
    """Refuse the held credential bindings the agent waits for: it cannot start (it ends as lost)."""
    agent = _agent(user, agent_id)
    outcome = commands.deny(user, agent.id, json_body(request), idempotency_key(request))
    return outcome_response(outcome)


# --- transcript pages ---------------------------------------------------------------------


@api_view("GET")
def agent_events(request, user, agent_id: str):
    """A page of the transcript: `?after=S` forward (seq > S) or `?before=S` backward."""
    agent = _agent(user, agent_id)
    return events_page(request, partial(journal.page_after, agent.id),
                       partial(journal.page_before, agent.id))


def events_page(request, read_after: Callable, read_before: Callable) -> JsonResponse:
    """A page of a journal (an agent's transcript, a sandbox session's):
    `read_after(after, limit)` / `read_before(before, limit)` give a journal.Page."""
    after, before = query_int(request, "after"), query_int(request, "before")
    if after is not None and before is not None:
        raise ApiError(400, "cursor.conflict", "Give after or before, not both.")
    limit = query_int(request, "limit", minimum=1, maximum=settings.ALINEO_PAGE_LIMIT_MAX)
    limit = limit or settings.ALINEO_PAGE_LIMIT_DEFAULT
    if before is not None:
        page = read_before(before, limit)
        cursor = {"next_before": page.first_seq if page.events else before}
    else:
        after = after or 0
        page = read_after(after, limit)
        cursor = {"next_after": page.last_seq if page.events else after}
    return JsonResponse(
        {
            "events": [e.as_dict() for e in page.events],
            "head": page.head,
            "has_more": page.has_more,
            **cursor,
        }
    )


# --- checkpoints ---------------------------------------------------------------------


@api_view("GET", "POST")
def agent_checkpoints(request, user, agent_id: str):
    """GET: secret-free metadata of the agent's checkpoints, newest first: never
    their contents. A zero-data-retention workspace has none to list.
    POST: take a checkpoint now (a command; its outcome at GET /api/commands/{id})."""
    agent = _agent(user, agent_id)
    if request.method == "POST":
        outcome = commands.send(user, agent.id, "checkpoint", json_body(request),
                                idempotency_key(request))
        return outcome_response(outcome)
    if agent.workspace.zero_data_retention:
        return JsonResponse({"checkpoints": [], "zero_data_retention": True})
    rows = list(Checkpoint.objects.filter(agent=agent).order_by("-created_at", "-id")[:200])
    event_ids = dict(
        Event.objects.filter(agent=agent, seq__in=[cp.through_seq for cp in rows]).values_list("seq", "id")
    )
    max_age = agent.workspace.checkpoint_max_age_days
    now = timezone.now()
    return JsonResponse({"checkpoints": [_checkpoint(cp, event_ids, max_age, now) for cp in rows],
                         "zero_data_retention": False})


def _checkpoint(cp: Checkpoint, event_ids: dict, max_age: int, now) -> dict:
    expires = cp.expires_under(max_age)
    state = "deleted" if cp.deleted_at else ("expired" if expires <= now else "live")
    return {
        "id": cp.pk,
        "turn": cp.turn,
        "through_sequence": cp.through_seq,
        "through_event_id": event_ids.get(cp.through_seq),
        "sandbox_id": cp.sandbox_id,
        "harness_revision": cp.harness_revision,
        "profile_revision": cp.profile_revision,
        "bytes": cp.bytes,
        "duration_ms": cp.duration_ms,
        "created_at": iso_ts(cp.created_at),
        "expires_at": iso_ts(expires),
        "deleted_at": iso_ts(cp.deleted_at) if cp.deleted_at else None,
        "state": state,
    }


# --- the live home ------------------------------------------------------------------------


@api_view("GET", "POST")
def agent_home_snapshot(request, user, agent_id: str):
    """POST: look at the live home of the agent's RUNNING sandbox (a command,
    202; its outcome at GET /api/commands/{id}); 409 when the sandbox is not
    running — looking never wakes one. GET: the newest live home's metadata
    (never its contents), or 404 when none is kept (it expires after an hour)."""
    agent = _agent(user, agent_id)
    if request.method == "POST":
        outcome = commands.send(user, agent.id, "home_snapshot", json_body(request),
                                idempotency_key(request))
        return outcome_response(outcome)
    row = live_home.newest(agent.id)
    if row is None:
        raise ApiError(404, "home_snapshot.none",
                       "No live home of this agent is kept (none was taken, or it expired); "
                       "POST to this URL while its sandbox runs to take one.")
    return JsonResponse({"home_snapshot": _live_home(row)})


def _live_home(row: LiveHome) -> dict:
    return {
        "id": row.pk,
        "agent": row.agent_id,
        "command": row.command_id,
        "sandbox_id": row.sandbox_id,
        "turn": row.turn,
        "through_sequence": row.through_seq,
        "bytes": row.bytes,
        "duration_ms": row.duration_ms,
        "taken_at": iso_ts(row.created_at),
        "expires_at": iso_ts(row.expires_at),
    }


# --- fork ------------------------------------------------------------------------------


@api_view("POST")
def agent_fork(request, user, agent_id: str):
    agent = _agent(user, agent_id)
    outcome = commands.fork(user, agent.id, json_body(request), idempotency_key(request))
    return outcome_response(outcome)


# --- commands' outcomes -------------------------------------------------------------------

_COMMAND_ID = re.compile(r"[0-9]{1,18}")


@api_view("GET")
def command_detail(request, user, command_id: str):
    """A command and what acting on it produced: {"id", "agent", "verb", "state",
    "result", "seq", "created_at", "acted_at"}. Another workspace's command is a
    404, like one that does not exist."""
    cmd = None
    if _COMMAND_ID.fullmatch(command_id):
        cmd = Command.objects.filter(pk=int(command_id), workspace__members=user).first()
    if cmd is None:
        raise ApiError(404, "command.not_found", f"No such command: {command_id[:64]!r}.")
    result = cmd.result if isinstance(cmd.result, dict) else {}
    if cmd.state == "failed" and "code" not in result and cmd.agent_id:
        # Failed by the driver's generic path: its command.failed fact says why.
        fact = (Event.objects.filter(agent_id=cmd.agent_id, type="command.failed",
                                     seq__gt=cmd.seq or 0, data__command=cmd.pk)
                .values_list("data", flat=True).first()) or {}
        result = {**result, "code": fact.get("code") or "command.failed",
                  "message": fact.get("reason") or "the command could not be acted on"}
    return JsonResponse({
        "id": cmd.pk,
        "agent": cmd.agent_id,
        "sandbox": cmd.sandbox_session_id,
        "verb": cmd.verb,
        "state": cmd.state,
        "result": result,
        "seq": cmd.seq,
        "created_at": iso_ts(cmd.created_at),
        "acted_at": iso_ts(cmd.acted_at) if cmd.acted_at else None,
    })


@csrf_exempt
def api_not_found(request, rest: str = ""):
    """Every other /api/ path: a JSON 404, never Django's HTML page."""
    return error_response(404, "api.not_found", f"No API endpoint at {request.path[:200]}.")


# --- site-wide error handlers, for alineo_site/urls.py ---------------------------------
# Routed /api/ paths already answer JSON; these cover what fails before a view
# runs (a middleware, a disallowed Host). Wire them in alineo_site/urls.py:
#   handler400 = "sessions.api.views.handler400"  (and 403, 404, 500 alike)


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def handler400(request, exception=None):
    if _is_api(request):
        return error_response(400, "request.invalid", "The request was refused as malformed.")
    return _page(request, "400.html", 400)


def handler403(request, exception=None):
    if _is_api(request):
        return error_response(403, "forbidden", "This request is not allowed.")
    return _page(request, "403.html", 403)


def handler404(request, exception=None):
    if _is_api(request):
        return api_not_found(request)
    return _page(request, "404.html", 404)


def _page(request, template: str, status: int):
    """templates/<status>.html. Not Django's default views: they are wrapped in
    requires_csrf_token, which parses the body, so a POST with a broken
    multipart body to a missing page raised MultiPartParserError in the 404
    handler itself (a 500; tests/unit/dashboard/test_bad_input_property.py)."""
    return render(request, template, {"request_path": request.path}, status=status)


def handler500(request):
    if _is_api(request):
        return error_response(500, "server.error", "An unexpected error occurred.")
    return defaults.server_error(request)


def csrf_failure(request, reason: str = ""):
    """settings.CSRF_FAILURE_VIEW: the site's 403 page, not Django's (its inline
    <style> is what the Content-Security-Policy refuses). API views check CSRF
    themselves (sessions/api/handler.py) and answer JSON."""
    return _page(request, "403.html", 403)
