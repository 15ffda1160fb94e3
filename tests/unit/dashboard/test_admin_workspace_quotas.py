"""The admin's workspace page edits the quotas (docs/SECURITY.md#children-approvals-and-quotas): a
saved quota is what the next spawn is held to; a value out of bounds is
refused with the field's message and changes nothing. The retention half of
the same page: tests/unit/dashboard/test_admin_retention.py."""

import pytest
from django.contrib.auth.models import Permission

from sessions.admin import QUOTA_FIELDS
from sessions.models import Workspace
from sessions.specs import LIMIT_MAX
from tests.unit.api.conftest import Caller, assert_error

from .test_admin_retention import quota_fields

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="root-password-123")
    client.force_login(admin)
    return client


def change_url(ws) -> str:
    return f"/admin/agent_sessions/workspace/{ws.pk}/change/"


def post_change(client, ws, **changes):
    data = {"name": ws.name, "members": [u.pk for u in ws.members.all()],
            "checkpoint_max_age_days": ws.checkpoint_max_age_days,
            "keep_newest_checkpoints": ws.keep_newest_checkpoints, **quota_fields(ws), **changes}
    return client.post(change_url(ws), data)


def test_the_page_shows_every_quota_with_its_defaults_and_what_is_in_use(admin_client, workspace,
                                                                         agent):
    html = admin_client.get(change_url(workspace)).content.decode()
    assert "Quotas" in html
    for name in QUOTA_FIELDS:
        assert f'name="{name}"' in html, name
    assert 'value="32"' in html and 'value="8"' in html  # max_agents, max_sandboxes
    assert "1 of 32 live agents, 0 of 8 sandboxes" in html


def test_a_raised_quota_is_saved_and_holds_for_the_next_spawn(admin_client, workspace, owner_token):
    api = Caller(owner_token)
    assert post_change(admin_client, workspace, max_agents=1, max_memory_mb=1024).status_code == 302
    workspace.refresh_from_db()
    assert (workspace.max_agents, workspace.max_memory_mb) == (1, 1024)
    assert api.post("/api/agents", {"spec": {"model": "demo"}}).status_code == 201
    assert_error(api.post("/api/agents", {"spec": {"model": "demo"}}), 429, "quota.agents")
    assert post_change(admin_client, workspace, max_agents=5).status_code == 302
    assert api.post("/api/agents", {"spec": {"model": "demo"}}).status_code == 201


@pytest.mark.parametrize("field, value", [
    ("max_agents", 0), ("max_depth", 0), ("max_sandboxes", 0), ("max_streams_per_user", 0),
    ("max_memory_mb", LIMIT_MAX["memory_mb"] + 1), ("max_pids", LIMIT_MAX["pids"] + 1),
    ("max_cpus", LIMIT_MAX["cpus"] + 1), ("max_cpus", 0), ("max_depth", 101),
])
def test_a_quota_out_of_bounds_is_refused_and_nothing_changes(admin_client, workspace, field,
                                                              value):
    before = quota_fields(Workspace.objects.get(pk=workspace.pk))
    response = post_change(admin_client, workspace, **{field: value})
    assert response.status_code == 200  # the form again, with the error
    assert "errorlist" in response.content.decode()
    assert quota_fields(Workspace.objects.get(pk=workspace.pk)) == before


def test_anonymous_is_sent_to_the_admin_login(client, workspace):
    response = client.get(change_url(workspace))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert client.post(change_url(workspace), {"max_agents": 1000}).status_code == 302
    assert Workspace.objects.get(pk=workspace.pk).max_agents == 32


def test_a_member_who_is_not_staff_cannot_edit(client, owner, workspace):
    client.force_login(owner)
    response = client.post(change_url(workspace), {"name": workspace.name, "max_agents": 1000})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert Workspace.objects.get(pk=workspace.pk).max_agents == 32


def test_staff_without_the_change_permission_is_a_403(client, teammate, workspace):
    teammate.is_staff = True
    teammate.save()
    teammate.user_permissions.add(Permission.objects.get(codename="view_workspace"))
    client.force_login(teammate)
    assert client.get(change_url(workspace)).status_code == 200  # may look
    response = client.post(change_url(workspace), {"name": workspace.name, **quota_fields(workspace),
                                             "max_agents": 1000})
    assert response.status_code == 403
    assert Workspace.objects.get(pk=workspace.pk).max_agents == 32


def test_an_unknown_workspace_is_not_found(admin_client):
    response = admin_client.get("/admin/agent_sessions/workspace/999999/change/")
    assert response.status_code == 302  # the admin's "does not exist" redirect to its index
    assert admin_client.get(response["Location"]).status_code == 200
