"""Sandbox sessions in the dashboard: the list of the workspace's sessions and
one session's page with its journal (newest page first, older pages by
``?before=<seq>``). They only read; scripts drive sessions through the API
(docs/API.md "Sandbox sessions")."""

from __future__ import annotations

import json

from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .. import inputs, sbjournal
from ..models import SandboxSession
from .common import bad_request, login_required

PAGE = 100
LIST_MAX = 500
DATA_SHOWN = 4000


def session_or_404(user, session_id: str) -> SandboxSession:
    row = SandboxSession.objects.filter(pk=session_id, workspace__members=user).first()
    if row is None:
        raise Http404("No such sandbox session.")
    return row


@require_GET
@login_required
def sandbox_list(request):
    rows = list(SandboxSession.objects.filter(workspace__members=request.user)
                .select_related("workspace").order_by("-created_at", "-id")[:LIST_MAX])
    return render(request, "sessions/sandboxes.html", {"sessions": rows})


def _row(event) -> dict:
    text = json.dumps(event.data, indent=1, sort_keys=True, ensure_ascii=False)
    data = event.data if isinstance(event.data, dict) else {}
    summary = " ".join(str(data[k]) for k in ("name", "exit_code", "code", "sandbox_id")
                       if k in data)
    argv = data.get("argv")
    if isinstance(argv, list):
        summary = " ".join(str(a) for a in argv)[:200] + (f" → {summary}" if summary else "")
    return {"seq": event.seq, "type": event.type, "ts": event.ts, "summary": summary,
            "data": text[:DATA_SHOWN], "cut": len(text) > DATA_SHOWN}


@require_GET
@login_required
def sandbox_page(request, session_id: str):
    row = session_or_404(request.user, session_id)
    raw = request.GET.get("before")
    before = inputs.cursor(raw) if raw is not None else row.last_seq + 1
    if before is None:
        return bad_request(request, "before must be a non-negative integer in the digits 0-9.")
    page = sbjournal.page_before(row.pk, before, PAGE)
    plan = sbjournal.plan_of(row.pk)
    return render(request, "sessions/sandbox.html", {
        "session": row, "events": [_row(e) for e in reversed(page.events)],
        "older": page.first_seq if page.has_more else None,
        "snapshots": sbjournal.snapshots(row.pk), "plan": plan,
        "newest": before > row.last_seq})
