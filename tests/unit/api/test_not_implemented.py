"""Fork: authenticated and scoped, then 501 until its issue lands; checkpoints are scoped alike."""

import pytest

from sessions.models import Agent

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def test_fork_answers_501_to_members_and_writes_nothing(api, teammate_api, spawned):
    assert_error(api.post(f"/api/agents/{spawned}/fork", {"at_event": 1}), 501, "not_implemented")
    assert_error(teammate_api.post(f"/api/agents/{spawned}/fork", {}), 501, "not_implemented")
    assert Agent.objects.count() == 1


@pytest.mark.parametrize("method, tail", [("GET", "checkpoints"), ("POST", "fork")])
def test_anonymous_outsider_and_unknown(anon, outsider_api, api, spawned, method, tail):
    assert_error(anon(method, f"/api/agents/{spawned}/{tail}"), 401)
    assert_error(outsider_api(method, f"/api/agents/{spawned}/{tail}"), 404, "agent.not_found")
    assert_error(api(method, f"/api/agents/ag_missing/{tail}"), 404, "agent.not_found")


def test_wrong_methods_are_405(api, spawned):
    assert_error(api.post(f"/api/agents/{spawned}/checkpoints"), 405)
    assert_error(api.get(f"/api/agents/{spawned}/fork"), 405)


def test_fork_checks_the_idempotency_key(api, spawned):
    assert_error(
        api.post(f"/api/agents/{spawned}/fork", {}, key="k" * 256), 400, "idempotency.key_invalid"
    )
