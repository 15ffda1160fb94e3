"""JSON API routes. A trailing slash is optional. The catch-all at
the end makes every other /api/ path a JSON 404 instead of Django's HTML page.
/api/agents/{id}/stream is routed in alineo_site/asgi.py, before Django."""

from django.urls import re_path

from . import budget_views, sandbox_views, views

_ID = r"(?P<agent_id>[^/]+)"
_SB = r"(?P<session_id>[^/]+)"

urlpatterns = [
    re_path(r"^agents/?$", views.agents, name="api-agents"),
    re_path(rf"^agents/{_ID}/?$", views.agent_detail, name="api-agent"),
    re_path(
        rf"^agents/{_ID}/(?P<verb>prompt|steer|interrupt|pause|resume|stop|reattach|rebridge)/?$",
        views.agent_command,
        name="api-agent-command",
    ),
    re_path(rf"^agents/{_ID}/approve/?$", views.agent_approve, name="api-agent-approve"),
    re_path(rf"^agents/{_ID}/deny/?$", views.agent_deny, name="api-agent-deny"),
    re_path(rf"^agents/{_ID}/events/?$", views.agent_events, name="api-agent-events"),
    re_path(
        rf"^agents/{_ID}/checkpoints/?$", views.agent_checkpoints, name="api-agent-checkpoints"
    ),
    re_path(rf"^agents/{_ID}/fork/?$", views.agent_fork, name="api-agent-fork"),
    re_path(rf"^agents/{_ID}/home-snapshot/?$", views.agent_home_snapshot,
            name="api-agent-home-snapshot"),
    re_path(r"^sandboxes/?$", sandbox_views.sandboxes, name="api-sandboxes"),
    re_path(rf"^sandboxes/{_SB}/?$", sandbox_views.sandbox_detail, name="api-sandbox"),
    re_path(rf"^sandboxes/{_SB}/(?P<verb>exec|resume|remove)/?$", sandbox_views.sandbox_command,
            name="api-sandbox-command"),
    re_path(rf"^sandboxes/{_SB}/snapshots/?$", sandbox_views.sandbox_snapshots,
            name="api-sandbox-snapshots"),
    re_path(rf"^sandboxes/{_SB}/events/?$", sandbox_views.sandbox_events,
            name="api-sandbox-events"),
    re_path(r"^workspaces/(?P<name>[^/]+)/budget/?$", budget_views.workspace_budget,
            name="api-workspace-budget"),
    re_path(r"^commands/(?P<command_id>[^/]+)/?$", views.command_detail, name="api-command"),
    # [\s\S], not ".": a path may hold a newline (%0A) too. (Django cannot reverse "(?s)".)
    re_path(r"^(?P<rest>[\s\S]*)$", views.api_not_found),
]
