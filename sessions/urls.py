"""Dashboard routes (the JSON API lives under /api/, see sessions/api/urls.py)."""

from django.urls import path, re_path

from .dashboard import actions, agent, agent_list, files, forking, live_files, sandboxes, tree, usage

_ID = r"(?P<agent_id>[A-Za-z0-9_-]{1,32})"

urlpatterns = [
    path("", tree.home, name="home"),
    path("tree", tree.tree_fragment, name="dash-tree"),
    path("agents/new", actions.spawn, name="dash-spawn"),
    path("agents/", agent_list.agent_list, name="dash-agents"),
    path("usage", usage.usage, name="dash-usage"),
    path("sandboxes/", sandboxes.sandbox_list, name="dash-sandboxes"),
    re_path(r"^sandboxes/(?P<session_id>sb_[0-9a-f]{16})/$", sandboxes.sandbox_page,
            name="dash-sandbox"),
    re_path(rf"^agents/{_ID}/$", agent.agent_page, name="dash-agent"),
    re_path(rf"^agents/{_ID}/live$", agent.agent_live, name="dash-agent-live"),
    re_path(rf"^agents/{_ID}/rows$", agent.agent_rows, name="dash-agent-rows"),
    re_path(rf"^agents/{_ID}/files$", files.files, name="dash-files"),
    re_path(rf"^agents/{_ID}/files/live$", live_files.take, name="dash-files-live"),
    re_path(rf"^agents/{_ID}/fork$", forking.fork, name="dash-fork"),
    re_path(rf"^agents/{_ID}/approve$", forking.approve, name="dash-approve"),
    re_path(rf"^agents/{_ID}/deny$", forking.deny, name="dash-deny"),
    re_path(
        rf"^agents/{_ID}/(?P<verb>prompt|steer|interrupt|pause|resume|stop)$",
        actions.command,
        name="dash-command",
    ),
]
