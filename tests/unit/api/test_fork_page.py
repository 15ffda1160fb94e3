"""Bug 8 of the operator's console (issue 15): a fork's page says it is a fork,
it has its own name, its restore history says where it began, and it shows the
conversation it inherited; status icons are inline SVG (they render where a
font has no ⏸ or ⏹)."""

import pytest

from sessions import journal

from .conftest import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(api):
    r = api.post("/api/agents", {"spec": {"model": "demo", "name": "builder"}})
    agent = r.json()["id"]
    journal.append_many(agent, [
        ("turn.started", {"turn": 1}),
        ("message.user", {"turn": 1, "text": "write the parser"}),
        ("message.assistant", {"turn": 1, "text": "the parser is written"}),
        ("turn.finished", {"turn": 1, "text": "the parser is written"}),
        ("turn.started", {"turn": 2}),
        ("message.user", {"turn": 2, "text": "after the fork point"}),
    ])
    return agent


def test_a_fork_has_its_own_name(api, source):
    named = api.post(f"/api/agents/{source}/fork", {"at_event": 5, "name": "try-b"}).json()["id"]
    unnamed = api.post(f"/api/agents/{source}/fork", {"at_event": 5}).json()["id"]
    assert api.get(f"/api/agents/{named}").json()["spec"]["name"] == "try-b"
    assert api.get(f"/api/agents/{unnamed}").json()["spec"]["name"] == "builder (fork)"
    assert_error(api.post(f"/api/agents/{source}/fork", {"at_event": 5, "name": 7}), 400)
    assert_error(api.post(f"/api/agents/{source}/fork", {"at_event": 5, "name": "x" * 101}), 400)


def test_a_forks_page_says_where_it_came_from_and_what_it_inherited(api, source, client, owner):
    fork = api.post(f"/api/agents/{source}/fork", {"at_event": 5}).json()["id"]
    client.force_login(owner)
    html = client.get(f"/agents/{fork}/").content.decode()
    banner = html[html.index('id="fork-origin"'):]
    assert f"Fork of" in banner[:400] and f"/agents/{source}/" in banner[:400]
    assert "event 5" in banner[:400]
    inherited = html[html.index('id="inherited"'):]
    inherited = inherited[:inherited.index("</details>")]
    assert "write the parser" in inherited and "the parser is written" in inherited
    assert "after the fork point" not in inherited
    side = html[html.index('id="side"'):]
    assert "Never restored" not in side and "Started as a fork of" in side


def test_status_icons_are_inline_svg(api, source, client, owner):
    from sessions.models import Agent

    Agent.objects.filter(pk=source).update(status="paused")
    client.force_login(owner)
    html = client.get("/").content.decode()
    badge = html[html.index('data-status="paused"'):]
    badge = badge[:badge.index("</span> Paused")]
    assert "<svg" in badge and "⏸" not in html and "⏹" not in html
