"""Fork where the operator looks (issue 15, Build 2): "fork from here" on a
settled turn and "fork from this checkpoint" in the side panel, each behind a
confirmation with a name field, through the same command as the API."""

from __future__ import annotations

import re

import pytest

from sessions.models import Agent, Command

pytestmark = pytest.mark.django_db

FACTS = [("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
         ("message.user", {"turn": 1, "text": "hi"}), ("turn.finished", {"turn": 1, "text": ""})]


def test_fork_from_here_is_offered_on_settled_turns_behind_a_confirmation(logged_in, make_agent):
    agent = make_agent(facts=FACTS)
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    row = re.search(r'<li id="row-4".*?</li>', html, re.S).group(0)
    assert '<details class="cmd confirm fork">' in row and "Fork from here…" in row
    assert 'name="at_event" value="4"' in row and 'name="name"' in row
    assert "Fork from here" not in re.search(r'<li id="row-3".*?</li>', html, re.S).group(0)


def test_fork_from_here_makes_a_named_fork_and_opens_it(logged_in, make_agent):
    agent = make_agent(facts=FACTS)
    response = logged_in.post(f"/agents/{agent.id}/fork",
                              {"at_event": "4", "name": "try-b", "idempotency_key": "f-1"})
    fork = Agent.objects.exclude(pk=agent.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/agents/{fork.id}/"
    assert fork.spec["name"] == "try-b"
    again = logged_in.post(f"/agents/{agent.id}/fork",
                           {"at_event": "4", "name": "try-b", "idempotency_key": "f-1"})
    assert again["Location"] == f"/agents/{fork.id}/" and Agent.objects.count() == 2


@pytest.mark.parametrize("fields,status", [
    ({}, 400), ({"at_event": "4", "checkpoint": "1"}, 400), ({"at_event": "x"}, 400),
    ({"at_event": "4", "name": "n" * 101}, 400), ({"at_event": "99"}, 409),
    ({"checkpoint": "12345"}, 404),
])
def test_bad_forks_are_refused_and_change_nothing(logged_in, make_agent, fields, status):
    agent = make_agent(facts=FACTS)
    response = logged_in.post(f"/agents/{agent.id}/fork", fields)
    assert response.status_code == status and b"Nothing was changed" in response.content
    assert Agent.objects.count() == 1 and not Command.objects.exists()


def test_fork_needs_a_login_and_the_workspace(client, outsider, make_agent):
    agent = make_agent(facts=FACTS)
    assert client.post(f"/agents/{agent.id}/fork", {"at_event": "4"}).status_code == 302
    client.force_login(outsider)
    assert client.post(f"/agents/{agent.id}/fork", {"at_event": "4"}).status_code == 404
    assert client.get(f"/agents/{agent.id}/fork").status_code in (404, 405)
    assert Agent.objects.count() == 1
