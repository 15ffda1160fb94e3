"""Files (issue 15, Build 6): the agent's home as of each checkpoint — a
directory listing, a file (bounded; binary shown as such), what each turn
changed (against the checkpoint before) with a per-file diff — read from the
checkpoint files with no sandbox at all. Workspace-scoped; a path out of the
home, an unknown checkpoint, a broken file: readable pages, never a 5xx."""

from __future__ import annotations

import pytest
from django.utils import timezone

from sessions.models import Checkpoint
from tests.unit.test_home_files import make_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(tmp_path, make_agent):
    agent = make_agent()
    later = timezone.now() + timezone.timedelta(days=5)

    def cp(turn, members, **kw):
        path = make_checkpoint(tmp_path / f"t{turn}.tar.zst", members, **kw)
        return Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=turn, through_seq=turn,
                                         path=str(path), bytes=path.stat().st_size, expires_at=later)

    first = cp(1, {"./": None, "./notes.txt": "one\n", "./src": None, "./src/app.py": "a = 1\n",
                   "./gone.txt": "bye"})
    second = cp(2, {"./": None, "./notes.txt": "one\ntwo\n", "./src": None,
                    "./src/app.py": "a = 1\n", "./logo.png": b"\x89PNG\x00\x00" * 50,
                    "./big.log": "x" * (300 << 10), "../../etc/cron.d/evil": "* * * * * rm"},
                links={"./passwd": "/etc/passwd"})
    return agent, first, second


def get(client, agent, query=""):
    return client.get(f"/agents/{agent.id}/files" + (f"?{query}" if query else ""))


def test_the_newest_checkpoint_is_listed_without_a_sandbox(client, owner, home):
    agent, first, second = home
    client.force_login(owner)
    html = get(client, agent).content.decode()
    assert "Checkpoint of turn 2" in html and "src/" in html and "notes.txt" in html
    assert "passwd" in html and "link, not followed" in html
    assert "evil" not in html and "1 member with unsafe names skipped" in html
    assert 'id="files-link"' in client.get(f"/agents/{agent.id}/").content.decode()
    html = get(client, agent, f"checkpoint={first.pk}&path=src").content.decode()
    assert "app.py" in html and "notes.txt" not in html


def test_a_file_binary_and_bounded(client, owner, home):
    agent, _, second = home
    client.force_login(owner)
    html = get(client, agent, "path=notes.txt").content.decode()
    assert 'id="file-view">one\ntwo\n</pre>' in html
    assert 'id="binary"' in get(client, agent, "path=logo.png").content.decode()
    html = get(client, agent, "path=big.log").content.decode()
    assert 'id="file-cut"' in html and html.count("x" * 1000) <= 262


def test_what_each_turn_changed_and_a_files_diff(client, owner, home):
    agent, first, second = home
    client.force_login(owner)
    html = get(client, agent, f"checkpoint={second.pk}&changes=1").content.decode()
    assert "since the checkpoint of turn 1" in html
    for name, what in [("notes.txt", "changed"), ("gone.txt", "removed"), ("logo.png", "added")]:
        assert f'<span class="badge">{what}</span> ' in html and name in html
    assert "src/app.py" not in html  # unchanged
    html = get(client, agent, f"checkpoint={second.pk}&path=notes.txt&diff=1").content.decode()
    assert '<span class="add">+two</span>' in html
    html = get(client, agent, f"checkpoint={first.pk}&changes=1").content.decode()
    assert "No earlier checkpoint is kept" in html


@pytest.mark.parametrize("query,status", [
    ("path=../../etc/passwd", 400), ("path=/etc/passwd", 400), ("path=a%00b", 400),
    ("path=nope.txt", 404), ("checkpoint=999999", 404), ("checkpoint=abc", 404),
    ("checkpoint=%C2%B2", 404), ("checkpoint=" + "9" * 40, 404), ("path=" + "a/" * 3000, 404),
    ("changes=yes&diff=2", 200), ("path=passwd", 200), ("path=passwd&diff=1", 200),
])
def test_bad_input_is_a_readable_page(client, owner, home, query, status):
    agent, _, _ = home
    client.force_login(owner)
    response = get(client, agent, query)
    assert response.status_code == status
    assert b"Traceback" not in response.content and b"root:" not in response.content


def test_a_broken_or_expired_checkpoint(client, owner, home, tmp_path):
    agent, first, second = home
    client.force_login(owner)
    (tmp_path / "t2.tar.zst").write_bytes(b"garbage")
    html = get(client, agent).content.decode()
    assert 'id="unreadable"' in html
    Checkpoint.objects.filter(pk=second.pk).update(expires_at=timezone.now() - timezone.timedelta(days=1))
    html = get(client, agent).content.decode()
    assert "Checkpoint of turn 1" in html
    assert get(client, agent, f"checkpoint={second.pk}").status_code == 404


def test_no_checkpoints_says_why(client, owner, make_agent):
    client.force_login(owner)
    agent = make_agent()
    html = client.get(f"/agents/{agent.id}/files").content.decode()
    assert 'id="no-checkpoints"' in html


def test_members_outsiders_strangers(client, teammate, outsider, home):
    agent, _, _ = home
    assert get(client, agent).status_code == 302  # to the login
    fragment = client.get(f"/agents/{agent.id}/files", HTTP_HX_REQUEST="true")
    assert fragment.status_code == 401
    client.force_login(outsider)
    assert get(client, agent).status_code == 404
    client.force_login(teammate)  # a member reads (no operator right needed to look)
    assert get(client, agent).status_code == 200
    assert client.post(f"/agents/{agent.id}/files").status_code == 405
