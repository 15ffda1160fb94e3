"""GET /api/agents/{id}/checkpoints: secret-free metadata, scoped, expiry shown honestly."""

from datetime import timedelta

import pytest
from django.utils import timezone

from sessions import journal
from sessions.credentials import set_secret
from sessions.models import Agent, Checkpoint, Workspace

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def _cp(agent_id, turn, **kw):
    now = timezone.now()
    return Checkpoint.objects.create(agent_id=agent_id, sandbox_id="sb1", turn=turn, through_seq=turn,
                                     path=f"/data/checkpoints/{agent_id}/sb1-turn-{turn}.tar.zst",
                                     bytes=1234, duration_ms=50, harness_revision="h1",
                                     expires_at=now + timedelta(days=30), **kw)


def test_members_see_metadata_newest_first(api, teammate_api, spawned):
    journal.append_many(spawned, [("turn.finished", {"turn": 1}), ("turn.finished", {"turn": 2})])
    _cp(spawned, 1)
    _cp(spawned, 2)
    body = api.get(f"/api/agents/{spawned}/checkpoints").json()
    assert [c["turn"] for c in body["checkpoints"]] == [2, 1]
    first = body["checkpoints"][0]
    assert set(first) == {"id", "turn", "through_sequence", "through_event_id", "sandbox_id",
                          "harness_revision", "profile_revision", "bytes", "duration_ms",
                          "created_at", "expires_at", "deleted_at", "state"}
    assert first["state"] == "live" and first["through_event_id"] is not None
    assert "path" not in first  # where the file lives is the server's business
    assert teammate_api.get(f"/api/agents/{spawned}/checkpoints").json() == body


def test_a_shortened_policy_shows_the_earlier_expiry(api, spawned):
    cp = _cp(spawned, 1)
    Checkpoint.objects.filter(pk=cp.pk).update(created_at=timezone.now() - timedelta(days=10))
    Workspace.objects.update(checkpoint_max_age_days=7)
    (row,) = api.get(f"/api/agents/{spawned}/checkpoints").json()["checkpoints"]
    assert row["state"] == "expired"


def test_no_secret_ever_appears(api, spawned):
    set_secret(Workspace.objects.get(), "tok", "canary-secret-123456")
    _cp(spawned, 1)
    assert "canary-secret-123456" not in api.get(f"/api/agents/{spawned}/checkpoints").content.decode()


def test_zero_data_retention_lists_nothing(api, spawned):
    _cp(spawned, 1)
    Workspace.objects.update(zero_data_retention=True)
    assert api.get(f"/api/agents/{spawned}/checkpoints").json()["checkpoints"] == []


def test_anonymous_outsider_unknown(anon, outsider_api, api, spawned):
    assert_error(anon("GET", f"/api/agents/{spawned}/checkpoints"), 401)
    assert_error(outsider_api.get(f"/api/agents/{spawned}/checkpoints"), 404, "agent.not_found")
    assert_error(api.get("/api/agents/ag_missing/checkpoints"), 404, "agent.not_found")
    assert Agent.objects.count() == 1
