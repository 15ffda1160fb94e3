import pytest


pytestmark = pytest.mark.django_db


def test_anonymous_goes_to_login_and_back(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/"


def test_tree_is_drawn_with_children_inside_parents(logged_in, make_agent):
    root = make_agent()
    child = make_agent(parent=root)
    html = logged_in.get("/").content.decode()
    node = html.index(f'id="node-{root.id}"')
    assert node < html.index(f'id="node-{child.id}"')
    # the child's list sits inside the root's list item
    assert html.index("<ul>", node) < html.index(f'id="node-{child.id}"')


def test_every_status_is_labelled_not_only_coloured(logged_in, make_agent):
    for status in ("starting", "running", "idle", "paused", "interrupted", "restoring",
                   "stopped", "lost", "unrecoverable"):
        make_agent(status=status)
    html = logged_in.get("/").content.decode()
    for label in ("Starting", "Running", "Idle", "Paused", "Interrupted", "Restoring",
                  "Stopped", "Lost", "Unrecoverable"):
        assert f"</span> {label}</span>" in html


def test_running_turn_shows_steps_and_elapsed(logged_in, make_agent):
    make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo"}}),
        ("turn.started", {}),
        ("message.assistant", {"text": "step one"}),
    ])
    html = logged_in.get("/").content.decode()
    assert "turn 1: 1 step," in html and "data-elapsed" in html


def test_last_restore_rung_is_shown(logged_in, make_agent):
    make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo"}}),
        ("agent.restored", {"rung": "resume", "reason": "bridge restarted"}),
    ])
    assert "resumed its session" in logged_in.get("/").content.decode()


def test_outsider_does_not_see_other_workspaces(client, outsider, make_agent):
    agent = make_agent()
    client.force_login(outsider)
    assert agent.id not in client.get("/").content.decode()


def test_teammate_sees_the_tree(client, teammate, make_agent):
    agent = make_agent()
    client.force_login(teammate)
    assert agent.id in client.get("/").content.decode()


def test_stopped_agent_explains_why_commands_cannot_run(logged_in, make_agent):
    make_agent(status="stopped")
    html = logged_in.get("/").content.decode()
    assert "Stopped: commands cannot run" in html


def test_every_form_carries_its_own_idempotency_key(logged_in, make_agent):
    make_agent(), make_agent()
    html = logged_in.get("/").content.decode()
    import re

    keys = re.findall(r'name="idempotency_key" value="([^"]+)"', html)
    assert len(keys) >= 6 and len(set(keys)) == len(keys)


def test_relative_times_carry_the_exact_time(logged_in, make_agent):
    make_agent()
    html = logged_in.get("/").content.decode()
    assert 'data-rel>' in html and 'title="20' in html and " UTC" in html


def test_the_tree_shows_where_a_fork_came_from(client, owner, workspace):
    from sessions import journal
    from sessions.models import Agent

    source = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    fork = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    journal.append(fork.id, "agent.spawned", {"fork": {"agent": source.id, "at_event": 7}})
    client.force_login(owner)
    html = client.get("/").content.decode()
    assert f"forked from <a href=\"/agents/{source.id}" in html and "@ event 7" in html


def test_the_tree_page_says_when_agents_cannot_be_spawned_or_isolated(logged_in, monkeypatch):
    from sandboxes.backends.unavailable import UnavailableBackend
    from sandboxes.backends.unisolated import UnisolatedBackend

    none = UnavailableBackend("no sandbox backend: bubblewrap is not installed")
    monkeypatch.setattr("sessions.dashboard.tree.get_backend", lambda: none)
    html = logged_in.get("/").content.decode()
    assert 'id="sandbox-notice"' in html and "bubblewrap is not installed" in html
    monkeypatch.setattr("sessions.dashboard.tree.get_backend", lambda: UnisolatedBackend(root="/nonexistent"))
    assert "UNISOLATED" in logged_in.get("/").content.decode()


def test_the_tree_page_says_nothing_when_sandboxes_are_isolated(logged_in, monkeypatch):
    from sandboxes.backends.local import LocalBackend

    local = LocalBackend(root="/nonexistent")
    monkeypatch.setattr(local, "unavailable_reason", lambda: None)
    monkeypatch.setattr("sessions.dashboard.tree.get_backend", lambda: local)
    assert 'id="sandbox-notice"' not in logged_in.get("/").content.decode()


def test_a_first_step_in_flight_is_not_zero_steps(logged_in, make_agent):
    agent = make_agent(facts=[("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
                              ("message.delta", {"turn": 1, "text": "streaming"})])
    for html in (logged_in.get("/").content.decode(),
                 logged_in.get(f"/agents/{agent.id}/").content.decode()):
        assert "turn 1: <time" in html and "0 steps" not in html
