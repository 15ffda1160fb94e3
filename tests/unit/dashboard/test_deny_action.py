"""Deny a held credential where the operator looks (issue 15, Build 2): next to
Approve, behind a confirmation, with a required reason; who and why are
journaled, and the transcript says so. Operator-only; others are told."""

from __future__ import annotations

import pytest

from sessions.models import Event

from .test_approve_action import waiting  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db


def test_an_operator_denies_with_a_reason_and_it_is_journaled(client, operator, waiting):  # noqa: F811
    client.force_login(operator)
    html = client.get(f"/agents/{waiting.id}/").content.decode()
    assert f'id="deny-{waiting.id}"' in html and "Denying ends the agent as lost" in html
    response = client.post(f"/agents/{waiting.id}/deny",
                           {"reason": "wrong repository", "idempotency_key": "d-1"})
    assert response.status_code == 302
    fact = Event.objects.get(agent=waiting, type="credential.denied")
    assert fact.data["by"] == operator.username and fact.data["reason"] == "wrong repository"
    html = client.get(f"/agents/{waiting.id}/").content.decode()
    assert "Waiting for approval of the held" not in html
    assert "Credential denied" in html and f"deploy-token by {operator.username}: wrong repository" in html


def test_a_denial_without_a_reason_is_a_readable_400(client, operator, waiting):  # noqa: F811
    client.force_login(operator)
    response = client.post(f"/agents/{waiting.id}/deny", {"reason": " "})
    assert response.status_code == 400 and b"Say why" in response.content
    assert not Event.objects.filter(agent=waiting, type="credential.denied").exists()


def test_a_member_who_is_not_an_operator_cannot_deny(client, owner, waiting):  # noqa: F811
    client.force_login(owner)
    assert f'id="deny-{waiting.id}"' not in client.get(f"/agents/{waiting.id}/").content.decode()
    assert client.post(f"/agents/{waiting.id}/deny", {"reason": "x"}).status_code == 403
    assert not Event.objects.filter(agent=waiting, type="credential.denied").exists()


def test_outsiders_and_strangers_get_nothing(client, outsider, waiting):  # noqa: F811
    assert client.post(f"/agents/{waiting.id}/deny", {"reason": "x"}).status_code == 302
    client.force_login(outsider)
    assert client.post(f"/agents/{waiting.id}/deny", {"reason": "x"}).status_code == 404
    assert not Event.objects.filter(agent=waiting, type="credential.denied").exists()
