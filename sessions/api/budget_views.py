"""A workspace's daily budget (docs/GATEWAY.md "Budgets", docs/API.md):
members read it with today's spending; an operator (staff, or the permission
to change workspaces) sets it. Another workspace is a 404."""

from __future__ import annotations

from django.db import transaction
from django.http import JsonResponse

from ..access import may_change_workspace, visible_workspace
from ..gateway import budget
from ..models import Workspace
from .errors import ApiError, not_found
from .handler import api_view, json_body


@api_view("GET", "PUT")
def workspace_budget(request, user, name: str):
    workspace = visible_workspace(user, name)
    if workspace is None:
        raise not_found("workspace")
    if request.method == "PUT":
        if not may_change_workspace(user):
            raise ApiError(403, "budget.forbidden",
                           "Setting a budget takes a workspace operator: staff, or the "
                           "agent_sessions.change_workspace permission (granted in the admin).")
        try:
            values = budget.parse(json_body(request))
        except budget.BudgetInvalid as exc:
            raise ApiError(400, exc.code, exc.message) from None
        with transaction.atomic():
            Workspace.objects.filter(pk=workspace.pk).update(**values)
        workspace.refresh_from_db()
    return JsonResponse(budget.summary(workspace))
