import pytest

from sessions.models import Agent, Command, Workspace

pytestmark = pytest.mark.django_db


def test_anonymous_goes_to_login_and_back(client):
    response = client.get("/agents/new")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/agents/new"


def test_form_offers_saved_specs(logged_in):
    html = logged_in.get("/agents/new").content.decode()
    assert "Demo model (offline)" in html and 'name="spec"' in html and 'name="prompt"' in html


def test_spawn_from_a_saved_spec_with_a_first_prompt(logged_in, owner):
    response = logged_in.post("/agents/new", {"example": "demo", "spec": "", "prompt": "say: hi",
                                              "idempotency_key": "k-spawn-1"})
    agent = Agent.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/agents/{agent.id}/"
    assert agent.created_by == owner and agent.spec["model"] == "demo"
    types = list(agent.events.order_by("seq").values_list("type", flat=True))
    assert types == ["agent.spawned", "command.prompt"]


def test_double_click_spawns_once(logged_in):
    body = {"example": "", "spec": '{"model": "demo"}', "prompt": "", "idempotency_key": "k-twice"}
    first = logged_in.post("/agents/new", body)
    second = logged_in.post("/agents/new", body, HTTP_IDEMPOTENCY_KEY="k-twice")
    assert first["Location"] == second["Location"]
    assert Agent.objects.count() == 1 and Command.objects.filter(verb="spawn").count() == 1


def test_invalid_json_is_explained_next_to_the_field(logged_in):
    response = logged_in.post("/agents/new", {"example": "", "spec": '{"model": "demo",}'})
    html = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_spec-error"' in html and "This is not valid JSON" in html and "line 1" in html
    assert Agent.objects.count() == 0


def test_unknown_spec_key_is_named(logged_in):
    response = logged_in.post("/agents/new", {"example": "", "spec": '{"model": "demo", "colour": 1}'})
    assert response.status_code == 400 and "unknown key(s): colour" in response.content.decode()


def test_no_spec_at_all_is_refused_with_a_message(logged_in):
    response = logged_in.post("/agents/new", {"example": "", "spec": ""})
    assert response.status_code == 400 and "Paste a spec, or choose a saved one." in response.content.decode()


def test_child_of_a_visible_parent(logged_in, make_agent):
    parent = make_agent()
    html = logged_in.get(f"/agents/new?parent={parent.id}").content.decode()
    assert f"Spawn a child of {parent.id}" in html
    response = logged_in.post("/agents/new", {"example": "demo", "parent": parent.id})
    child = Agent.objects.exclude(pk=parent.pk).get()
    assert response.status_code == 302 and child.parent_id == parent.id
    assert parent.events.filter(type="agent.child_spawned").exists()


def test_outsider_cannot_spawn_under_another_workspaces_agent(client, outsider, make_agent):
    parent = make_agent()
    client.force_login(outsider)
    assert client.get(f"/agents/new?parent={parent.id}").status_code == 404
    assert client.post("/agents/new", {"example": "demo", "parent": parent.id}).status_code == 404


def test_child_of_a_stopped_parent_explains_why(logged_in, make_agent):
    parent = make_agent(status="stopped")
    response = logged_in.post("/agents/new", {"example": "demo", "parent": parent.id})
    assert response.status_code == 409 and "is stopped" in response.content.decode()


def test_user_without_workspace_is_told(client, django_user_model):
    user = django_user_model.objects.create_user("nomad", password="nomad-password-123")
    client.force_login(user)
    response = client.post("/agents/new", {"example": "demo"})
    assert response.status_code == 403 and "not a member of any workspace" in response.content.decode()


# --- quotas and the parent's bounds: the form shows the refusal, nothing is spawned ------------


def test_a_spawn_beyond_the_live_agents_quota_shows_the_quota(logged_in, workspace, make_agent):
    make_agent()
    Workspace.objects.filter(pk=workspace.pk).update(max_agents=1)
    response = logged_in.post("/agents/new", {"example": "demo", "prompt": "say: hi"})
    html = response.content.decode()
    assert response.status_code == 429
    assert 'role="alert"' in html and "its quota of 1" in html and "max_agents" in html
    assert Agent.objects.count() == 1


def test_limits_above_the_workspaces_cap_are_shown_on_the_spec(logged_in):
    spec = '{"model": "demo", "limits": {"memory_mb": 1048576}}'
    response = logged_in.post("/agents/new", {"example": "", "spec": spec})
    html = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_spec-error"' in html and "spec.limits.memory_mb is 1048576" in html
    assert Agent.objects.count() == 0


def test_a_child_wider_than_its_parent_is_shown_on_the_spec(logged_in, make_agent):
    parent = make_agent()
    response = logged_in.post("/agents/new", {"example": "", "parent": parent.id,
                                              "spec": '{"model": "demo", "network": "host"}'})
    html = response.content.decode()
    assert response.status_code == 403
    assert 'id="id_spec-error"' in html and "may not be wider than its parent" in html
    assert Agent.objects.count() == 1


def test_a_child_too_deep_shows_the_depth_quota(logged_in, workspace, make_agent):
    Workspace.objects.filter(pk=workspace.pk).update(max_depth=1)
    parent = make_agent()
    response = logged_in.post("/agents/new", {"example": "demo", "parent": parent.id})
    assert response.status_code == 409 and "max_depth" in response.content.decode()
