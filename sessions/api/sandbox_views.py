"""The JSON API of sandbox sessions (docs/API.md "Sandbox sessions"). Views only
read; every write is a command (sessions/commands/sandbox.py) that the worker
acts on. Another workspace's session is a 404, like one that does not exist."""

from __future__ import annotations

import re
from functools import partial

from django.conf import settings
from django.db.models import Q
from django.http import JsonResponse

from .. import sbjournal
from ..commands import sandbox as commands
from ..models import SandboxSession, iso_ts
from .errors import ApiError, not_found
from .handler import api_view, idempotency_key, json_body, outcome_response, query_int
from .views import events_page

_ID = re.compile(r"sb_[0-9a-f]{16}")


def visible(user, session_id: str) -> SandboxSession:
    row = None
    if _ID.fullmatch(session_id):
        row = SandboxSession.objects.filter(pk=session_id, workspace__members=user).first()
    if row is None:
        raise not_found("sandbox")
    return row


def summary(row: SandboxSession) -> dict:
    return {"id": row.id, "name": row.name, "status": row.status,
            "status_reason": row.status_reason, "sandbox_id": row.sandbox_id or None,
            "sandbox_host": row.sandbox_host or None, "last_seq": row.last_seq,
            "created_at": iso_ts(row.created_at)}


@api_view("GET", "POST")
def sandboxes(request, user):
    if request.method == "POST":
        return outcome_response(commands.create(user, json_body(request), idempotency_key(request)))
    limit = query_int(request, "limit", minimum=1, maximum=settings.ALINEO_PAGE_LIMIT_MAX)
    limit = limit or settings.ALINEO_PAGE_LIMIT_DEFAULT
    rows = SandboxSession.objects.filter(workspace__members=user).order_by("created_at", "id")
    after = request.GET.get("after")
    if after is not None:
        try:
            cursor = visible(user, after)
        except ApiError:
            raise ApiError(400, "after.invalid",
                           "after must be the id of a sandbox session you can see.") from None
        rows = rows.filter(Q(created_at__gt=cursor.created_at)
                           | Q(created_at=cursor.created_at, id__gt=cursor.id))
    page = list(rows[: limit + 1])
    has_more, page = len(page) > limit, page[:limit]
    return JsonResponse({"sandboxes": [summary(r) for r in page], "has_more": has_more,
                         "next_after": page[-1].id if page else after})


@api_view("GET")
def sandbox_detail(request, user, session_id: str):
    row = visible(user, session_id)
    plan = sbjournal.plan_of(row.pk)
    return JsonResponse({**summary(row), "workspace": row.workspace.name, "spec": row.spec,
                         "snapshots": sbjournal.snapshots(row.pk),
                         "replay": {"snapshot": plan.snapshot and plan.snapshot["name"],
                                    "execs": len(plan.execs),
                                    "not_replayed": plan.not_replayed}})


@api_view("POST")
def sandbox_command(request, user, session_id: str, verb: str):
    row = visible(user, session_id)
    return outcome_response(commands.send(user, row.pk, verb, json_body(request),
                                          idempotency_key(request)))


@api_view("GET", "POST")
def sandbox_snapshots(request, user, session_id: str):
    """GET: the named snapshots, oldest first. POST {"name"}: take one (a command)."""
    row = visible(user, session_id)
    if request.method == "POST":
        return outcome_response(commands.send(user, row.pk, "checkpoint", json_body(request),
                                              idempotency_key(request)))
    return JsonResponse({"snapshots": [{k: s[k] for k in ("name", "seq", "ts")}
                                       for s in sbjournal.snapshots(row.pk)]})


@api_view("GET")
def sandbox_events(request, user, session_id: str):
    """A page of the session's journal: `?after=S` forward or `?before=S` backward."""
    row = visible(user, session_id)
    return events_page(request, partial(sbjournal.page_after, row.pk),
                       partial(sbjournal.page_before, row.pk))
