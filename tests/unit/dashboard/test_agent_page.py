import pytest
from django.utils import timezone

from sessions import journal
from sessions.models import Checkpoint

pytestmark = pytest.mark.django_db


def test_anonymous_goes_to_login_and_back(client, make_agent):
    agent = make_agent()
    response = client.get(f"/agents/{agent.id}/")
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next=/agents/{agent.id}/"


def test_outsider_gets_404_without_a_stack_trace(client, outsider, make_agent):
    agent = make_agent()
    client.force_login(outsider)
    response = client.get(f"/agents/{agent.id}/")
    assert response.status_code == 404
    assert b"Traceback" not in response.content and agent.id.encode() not in response.content


def test_teammate_sees_the_latest_page_with_its_cursor(client, teammate, make_agent):
    agent = make_agent(facts=[("operator.note", {"text": f"n{i}"}) for i in range(1, 151)])
    client.force_login(teammate)
    html = client.get(f"/agents/{agent.id}/").content.decode()
    assert 'data-cursor="150"' in html and 'data-first="51"' in html and 'data-has-older="1"' in html
    assert 'id="row-150"' in html and 'id="row-51"' in html and 'id="row-50"' not in html
    assert html.count('class="row ') == 100
    assert 'id="stream-banner"' in html and "Reconnecting" in html
    assert f'data-stream-url="/api/agents/{agent.id}/stream"' in html


def test_long_tool_output_is_collapsed_and_short_one_shown(logged_in, make_agent):
    agent = make_agent(facts=[
        ("tool.dispatched", {"tool_call_id": "tc1", "name": "bash", "input": {"cmd": "ls"}}),
        ("tool.result", {"tool_call_id": "tc1", "output": "x\n" * 400, "exit_code": 0}),
        ("tool.result", {"tool_call_id": "tc2", "output": "short", "exit_code": 2}),
    ])
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert '<details class="raw"><summary>output · 800 B, 401 lines' in html
    assert "data-copy>Copy</button>" in html
    assert '<pre class="raw" aria-label="input">' in html and "&quot;cmd&quot;: &quot;ls&quot;" in html
    assert "exit 2" in html and 'class="row kind-tool failed"' in html
    assert 'data-call="tc1"' in html and 'data-result-of="tc1"' in html


def test_side_panel_shows_restores_and_checkpoints(logged_in, make_agent):
    agent = make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo"}}),
        ("agent.restored", {"rung": "restore", "reason": "sandbox gone",
                            "old_sandbox_id": "sb-1", "new_sandbox_id": "sb-2"}),
    ])
    now = timezone.now()
    Checkpoint.objects.create(agent=agent, sandbox_id="sb-2", turn=3, through_seq=2,
                              bytes=2_500_000, expires_at=now + timezone.timedelta(days=29))
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert "sandbox gone" in html and "sb-1 → sb-2" in html
    assert 'id="head-restore"' in html and "restored from its latest checkpoint" in html
    assert "<td>3</td><td>2.4 MB</td>" in html and "in 29 d" in html


def test_html_in_transcript_is_escaped(logged_in, make_agent):
    agent = make_agent(facts=[("message.assistant", {"text": "<script>alert(1)</script>"})])
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;" in html


def test_empty_transcript_renders(logged_in, workspace, owner):
    from sessions.models import Agent

    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert 'data-cursor="0"' in html and "No events yet" in html
    journal.append(agent.id, "operator.note", {"text": "first"})


def test_the_head_names_the_worker_driving_the_agent_and_the_engine(logged_in, make_agent):
    from datetime import timedelta

    from sessions.models import AgentLease

    agent = make_agent(facts=[("agent.sandbox", {"sandbox_id": "c-123", "host": "unix:///run/b.sock"})])
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert 'title="on unix:///run/b.sock"' in html and "driven by" not in html
    now = timezone.now()
    lease = AgentLease.objects.create(agent=agent, holder="box/1a2b:4242:99", acquired_at=now,
                                      expires_at=now + timedelta(seconds=20))
    assert "driven by <code>box/1a2b:4242:99</code>" in logged_in.get(f"/agents/{agent.id}/").content.decode()
    lease.expires_at = now - timedelta(seconds=1)  # an expired lease drives nothing
    lease.save()
    assert "driven by" not in logged_in.get(f"/agents/{agent.id}/").content.decode()


def test_side_panel_expiry_follows_a_shortened_policy(logged_in, make_agent):
    """The policy was shortened to 7 days after a checkpoint was taken with 30:
    the panel says what the API says (6 days less the test's own milliseconds
    left: "in 5 d 23 h", not the floored "in 5 d"), and one past the new
    policy is not offered as live at all."""
    agent = make_agent(facts=[("agent.spawned", {"spec": {"model": "demo"}})])
    now = timezone.now()
    fresh = Checkpoint.objects.create(agent=agent, sandbox_id="sb-1", turn=4, through_seq=1,
                                      bytes=1000, expires_at=now + timezone.timedelta(days=30))
    Checkpoint.objects.filter(pk=fresh.pk).update(created_at=now - timezone.timedelta(days=1))
    old = Checkpoint.objects.create(agent=agent, sandbox_id="sb-1", turn=2, through_seq=1,
                                    bytes=1000, expires_at=now + timezone.timedelta(days=20))
    Checkpoint.objects.filter(pk=old.pk).update(created_at=now - timezone.timedelta(days=10))
    agent.workspace.checkpoint_max_age_days = 7
    agent.workspace.save()
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert "<td>4</td>" in html and "in 5 d 23 h<" in html and "in 29 d" not in html
    assert "<td>2</td>" not in html  # past the new policy: no longer a checkpoint to count on
