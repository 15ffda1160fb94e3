"""Files, live (issue 15, Build 6: "the live home when the sandbox runs"): the
"Look at the live home" button on the Files page (only while the sandbox
runs), the page that waits for the worker's copy, and the copy shown with
the checkpoints' code — labelled live, its changes against the newest
checkpoint, binary flagged, links not followed. Refusals are readable pages
that write nothing; members look, outsiders get a 404."""

from __future__ import annotations

import pytest
from django.utils import timezone

from sessions.models import Agent, Checkpoint, Command, LiveHome, UNLOADED
from tests.unit.test_home_files import make_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(make_agent):
    a = make_agent()
    Agent.objects.filter(pk=a.pk).update(sandbox_id="sb-live", status="running")
    a.refresh_from_db()
    return a


def _files(client, agent, query=""):
    return client.get(f"/agents/{agent.id}/files" + (f"?{query}" if query else ""))


def _live(agent, tmp_path):
    later = timezone.now() + timezone.timedelta(days=5)
    cp = make_checkpoint(tmp_path / "t1.tar.zst", {"./": None, "./notes.txt": "one\n"})
    Checkpoint.objects.create(agent=agent, sandbox_id="sb-live", turn=1, through_seq=1,
                              path=str(cp), bytes=1, expires_at=later)
    path = make_checkpoint(tmp_path / "live.tar.zst", {
        "./": None, "./notes.txt": "one\ntwo\n", "./live.txt": "written mid-turn\n",
        "./blob.bin": b"\x00\xff" * 64}, links={"./passwd": "/etc/passwd"})
    return LiveHome.objects.create(agent=agent, sandbox_id="sb-live", turn=1, path=str(path),
                                   bytes=10, expires_at=timezone.now() + timezone.timedelta(hours=1))


def test_the_button_only_while_the_sandbox_runs(client, owner, agent):
    client.force_login(owner)
    html = _files(client, agent).content.decode()
    assert 'id="look-button"' in html and 'id="look-refused"' not in html
    Agent.objects.filter(pk=agent.pk).update(status="idle", status_reason=UNLOADED)
    html = _files(client, agent).content.decode()
    assert 'id="look-button"' not in html and "looking never wakes a sandbox" in html


def test_look_then_wait_then_see_it(client, owner, agent, tmp_path):
    client.force_login(owner)
    r = client.post(f"/agents/{agent.id}/files/live", {"idempotency_key": "k-look"})
    cmd = Command.objects.get(agent=agent, verb="home_snapshot")
    assert r.status_code == 302 and r["Location"].endswith(f"?live=1&look={cmd.pk}")
    html = client.get(r["Location"]).content.decode()
    assert 'id="look-pending"' in html and 'http-equiv="refresh"' in html and 'id="no-live"' in html
    _live(agent, tmp_path)
    Command.objects.filter(pk=cmd.pk).update(state="done")
    html = client.get(r["Location"]).content.decode()
    assert 'http-equiv="refresh"' not in html and 'id="live-label"' in html
    assert "Live, taken at" in html and "live.txt" in html
    assert "passwd" in html and "link, not followed" in html
    html = _files(client, agent, "live=1&path=live.txt").content.decode()
    assert 'id="file-view">written mid-turn\n</pre>' in html
    assert 'id="binary"' in _files(client, agent, "live=1&path=blob.bin").content.decode()
    html = _files(client, agent, "live=1&changes=1").content.decode()
    assert "What changed since the newest checkpoint (turn 1)" in html
    assert '<span class="badge">added</span> ' in html and "live.txt" in html
    html = _files(client, agent, "live=1&path=notes.txt&diff=1").content.decode()
    assert '<span class="add">+two</span>' in html
    # the checkpoint view is unchanged, and offers the live tab
    html = _files(client, agent).content.decode()
    assert "Checkpoint of turn 1" in html and 'id="live-tab"' in html and "live.txt" not in html


def test_a_failed_look_says_why(client, owner, agent):
    client.force_login(owner)
    client.post(f"/agents/{agent.id}/files/live", {})
    cmd = Command.objects.get(agent=agent, verb="home_snapshot")
    Command.objects.filter(pk=cmd.pk).update(state="failed", result={
        "code": "home_snapshot.not_running", "message": "its sandbox stopped"})
    html = _files(client, agent, f"live=1&look={cmd.pk}").content.decode()
    assert 'id="look-failed"' in html and "its sandbox stopped" in html


def test_refused_and_bad_input_write_nothing(client, owner, agent, make_agent):
    client.force_login(owner)
    Agent.objects.filter(pk=agent.pk).update(status="idle", status_reason=UNLOADED)
    r = client.post(f"/agents/{agent.id}/files/live", {})
    assert r.status_code == 409 and b"never wakes a sandbox" in r.content
    r = client.post(f"/agents/{agent.id}/files/live", {"idempotency_key": "k" * 300})
    assert r.status_code == 400
    assert not Command.objects.filter(verb="home_snapshot").exists()
    other = make_agent()
    foreign = Command.objects.create(workspace_id=other.workspace_id, user=owner, agent=other,
                                     verb="home_snapshot", request_hash="x", response_status=202)
    for bad in ("abc", "²", "9" * 40, str(foreign.pk)):
        assert _files(client, agent, f"live=1&look={bad}").status_code == 404
    assert _files(client, agent, "live=yes").status_code == 200


def test_members_outsiders_strangers(client, teammate, outsider, agent):
    url = f"/agents/{agent.id}/files/live"
    r = client.post(url, {})
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    assert client.post(url, {}, HTTP_HX_REQUEST="true").status_code == 401
    client.force_login(outsider)
    assert client.post(url, {}).status_code == 404
    assert not Command.objects.filter(verb="home_snapshot").exists()
    client.force_login(teammate)  # a member may look
    assert client.post(url, {}).status_code == 302
    assert client.get(url).status_code == 405
