"""The dashboard's sandbox session pages (sessions/dashboard/sandboxes.py): the
list and one session's page with its journal, workspace-scoped, paged."""

import pytest

from sessions import sbjournal
from sessions.models import SandboxSession

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(workspace, owner):
    row = SandboxSession.objects.create(workspace=workspace, created_by=owner, name="build",
                                        spec={"image": "default"})
    sbjournal.append(row.pk, "session.created", {"spec": row.spec, "name": "build"})
    sbjournal.append(row.pk, "exec.finished", {"argv": ["make", "deps"], "exit_code": 0,
                                               "stdout": "<script>x</script>"})
    sbjournal.append(row.pk, "snapshot.taken", {"name": "deps", "ref": "r"})
    sbjournal.append(row.pk, "exec.finished", {"argv": ["make", "test"], "exit_code": 2})
    return row


def test_the_list_shows_the_workspace_sessions(client, teammate, session, other_workspace,
                                               outsider):
    foreign = SandboxSession.objects.create(workspace=other_workspace, created_by=outsider)
    client.force_login(teammate)
    body = client.get("/sandboxes/").content.decode()
    assert session.pk in body and "build" in body and foreign.pk not in body


def test_the_page_shows_the_journal_snapshots_and_replay(client, teammate, session):
    client.force_login(teammate)
    r = client.get(f"/sandboxes/{session.pk}/")
    body = r.content.decode()
    assert r.status_code == 200
    assert body.index('id="row-4"') < body.index('id="row-1"')  # newest first
    assert "make test" in body and "<code>deps</code>" in body
    assert "1 exec after snapshot <code>deps</code>" in body
    assert "<script>x</script>" not in body  # sandbox output is escaped


def test_older_pages(client, owner, session, monkeypatch):
    from sessions.dashboard import sandboxes

    monkeypatch.setattr(sandboxes, "PAGE", 2)
    client.force_login(owner)
    body = client.get(f"/sandboxes/{session.pk}/").content.decode()
    assert 'id="row-4"' in body and 'id="row-2"' not in body and "?before=3" in body
    older = client.get(f"/sandboxes/{session.pk}/?before=3").content.decode()
    assert 'id="row-2"' in older and 'id="row-1"' in older and 'id="row-3"' not in older
    assert client.get(f"/sandboxes/{session.pk}/?before=%C2%B2").status_code == 400


def test_login_and_workspace_are_required(client, outsider, session):
    r = client.get(f"/sandboxes/{session.pk}/")
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    assert client.get("/sandboxes/").status_code == 302
    client.force_login(outsider)
    assert client.get(f"/sandboxes/{session.pk}/").status_code == 404
    assert client.get("/sandboxes/sb_0000000000000000/").status_code == 404
    assert client.post("/sandboxes/").status_code == 405
