"""Approve a held credential where the operator looks (issue 15, Build 2): the
agent page says what the agent waits for; an operator approves with a reason,
and who and why are journaled; a member who is not an operator is told so."""

from __future__ import annotations

import pytest

from sessions import journal
from sessions.models import Agent, Event

pytestmark = pytest.mark.django_db

SPEC = {"model": "demo", "credentials": [{"name": "deploy-token", "env": "DEPLOY_TOKEN",
                                           "approval": "hold"}]}


@pytest.fixture
def waiting(workspace, owner):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec=SPEC)
    journal.append_many(agent.id, [("agent.spawned", {"spec": SPEC}),
                                   ("credential.approval_requested",
                                    {"bindings": ["deploy-token"], "reason": "first_start"})])
    return agent


def test_an_operator_approves_with_a_reason_and_it_is_journaled(client, operator, waiting):
    client.force_login(operator)
    html = client.get(f"/agents/{waiting.id}/").content.decode()
    assert "Waiting for approval" in html and "deploy-token" in html
    assert f'id="approve-{waiting.id}"' in html
    response = client.post(f"/agents/{waiting.id}/approve",
                           {"reason": "release 1.4 deploy", "idempotency_key": "a-1"})
    assert response.status_code == 302
    fact = Event.objects.get(agent=waiting, type="credential.approved")
    assert fact.data["by"] == operator.username and fact.data["reason"] == "release 1.4 deploy"
    assert "Waiting for approval" not in client.get(f"/agents/{waiting.id}/").content.decode()


def test_a_member_who_is_not_an_operator_is_told_and_refused(client, owner, waiting):
    client.force_login(owner)
    html = client.get(f"/agents/{waiting.id}/").content.decode()
    assert "Waiting for approval" in html and f'id="approve-{waiting.id}"' not in html
    assert "needs a workspace operator" in html
    response = client.post(f"/agents/{waiting.id}/approve", {"reason": "x"})
    assert response.status_code == 403
    assert not Event.objects.filter(agent=waiting, type="credential.approved").exists()


def test_outsiders_and_strangers_get_nothing(client, outsider, waiting):
    assert client.post(f"/agents/{waiting.id}/approve").status_code == 302  # to the login
    client.force_login(outsider)
    assert client.post(f"/agents/{waiting.id}/approve").status_code == 404
    assert not Event.objects.filter(agent=waiting, type="credential.approved").exists()


def test_a_reason_too_long_is_a_400(client, operator, waiting):
    client.force_login(operator)
    assert client.post(f"/agents/{waiting.id}/approve", {"reason": "r" * 501}).status_code == 400
