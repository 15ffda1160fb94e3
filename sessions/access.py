"""Who is asking, and what they may see and do: a bearer token or a browser
session, scoped to the user's workspaces. Another workspace's agent is a 404,
not a 403, so ids cannot be probed. Seeing an agent lets a member command it;
approving its held credentials takes more (:func:`may_approve`)."""

from __future__ import annotations

import re

from django.contrib.auth.models import AnonymousUser

from .models import Agent, ApiToken, Workspace

#: What an agent id can be (sessions/urls.py routes the same).
AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


def user_from_bearer(header: str | None):
    """The user a `Bearer <token>` header names, or None."""
    if not header or not header.startswith("Bearer "):
        return None
    raw = header[len("Bearer "):].strip()
    if not raw.startswith(ApiToken.PREFIX) or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("user").filter(digest=ApiToken.hash(raw)).first()
    if token is None or not token.user.is_active:
        return None
    return token.user


def request_user(request):
    """Bearer token first, then the session user; AnonymousUser when neither."""
    user = user_from_bearer(request.headers.get("Authorization"))
    if user is not None:
        return user
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else AnonymousUser()


def workspaces_of(user):
    return Workspace.objects.filter(members=user)


def visible_agent(user, agent_id: str) -> Agent | None:
    """The agent if it exists in one of the user's workspaces, else None."""
    if not isinstance(agent_id, str) or not AGENT_ID.fullmatch(agent_id):
        return None  # e.g. a NUL, which PostgreSQL refuses in a query: a 500, not a 404
    return Agent.objects.filter(pk=agent_id, workspace__members=user).first()


def default_workspace(user) -> Workspace | None:
    return workspaces_of(user).order_by("id").first()


#: The Django permission that lets a member approve held credential bindings
#: (sessions/models.py Credential.Meta.permissions; granted in the admin, on
#: the user or on a group).
APPROVE_PERMISSION = "agent_sessions.approve_credentials"


def may_approve(user) -> bool:
    """A workspace operator: staff, or a user (or group) granted
    APPROVE_PERMISSION. Membership alone is not enough: a held binding is held
    precisely so that the agent's own users cannot release its secret."""
    return bool(user.is_active and (user.is_staff or user.has_perm(APPROVE_PERMISSION)))


#: Django's own permission to edit a workspace (its admin page): who may set
#: its budgets (sessions/api/budget_views.py).
CHANGE_WORKSPACE_PERMISSION = "agent_sessions.change_workspace"


def may_change_workspace(user) -> bool:
    """A workspace operator: staff, or granted CHANGE_WORKSPACE_PERMISSION.
    A member sees the budget; one who could raise it would make it no limit."""
    return bool(user.is_active and (user.is_staff or user.has_perm(CHANGE_WORKSPACE_PERMISSION)))


def visible_workspace(user, name: str) -> Workspace | None:
    """The workspace of that name if the user is a member, else None."""
    if not isinstance(name, str) or not 0 < len(name) <= 100 or "\x00" in name:
        return None
    return workspaces_of(user).filter(name=name).first()
