"""POST /api/agents/{id}/fork: validation, 409s, scoping, idempotency; the source is untouched."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from sessions import journal
from sessions.models import Agent, Checkpoint, Command, Event, Workspace

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def _cp(agent_id, turn=1, **kw):
    folder = Path(settings.DATA_DIR) / "checkpoints" / agent_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sb-turn-{turn}.tar.zst"
    path.write_bytes(b"not really zstd")
    fields = {"expires_at": timezone.now() + timedelta(days=30), **kw}
    return Checkpoint.objects.create(agent_id=agent_id, sandbox_id="sb", turn=turn, through_seq=1,
                                     path=str(path), bytes=15, **fields)


def _source_state(agent_id):
    a = Agent.objects.get(pk=agent_id)
    return a.last_seq, a.status, a.sandbox_id


def test_fork_from_a_checkpoint_records_its_origin(api, spawned):
    cp = _cp(spawned)
    before = _source_state(spawned)
    r = api.post(f"/api/agents/{spawned}/fork", {"checkpoint": cp.pk, "prompt": "go on"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["forked_from"] == {"agent": spawned, "checkpoint": cp.pk, "through_seq": 1, "turn": 1}
    child = body["id"]
    assert _source_state(spawned) == before  # the source is untouched
    first = Event.objects.get(agent_id=child, seq=1)
    assert first.type == "agent.spawned" and first.data["fork"] == body["forked_from"]
    assert api.get(f"/api/agents/{child}").json()["forked_from"] == body["forked_from"]
    assert Command.objects.filter(agent_id=child, verb="prompt", state="pending").count() == 1


def test_fork_at_an_event_and_as_a_child(api, spawned):
    journal.append_many(spawned, [("turn.started", {"turn": 1}), ("message.user", {"text": "hi"})])
    parent = api.post("/api/agents", {"spec": {"model": "demo"}}).json()["id"]
    r = api.post(f"/api/agents/{spawned}/fork", {"at_event": 2, "parent": parent})
    assert r.status_code == 201
    assert r.json()["forked_from"] == {"agent": spawned, "at_event": 2}
    assert r.json()["id"] in api.get(f"/api/agents/{parent}").json()["children"]


def test_an_expired_or_deleted_checkpoint_is_409(api, spawned):
    expired = _cp(spawned, 1, expires_at=timezone.now() - timedelta(seconds=1))
    deleted = _cp(spawned, 2, deleted_at=timezone.now())
    for cp in (expired, deleted):
        assert_error(api.post(f"/api/agents/{spawned}/fork", {"checkpoint": cp.pk}), 409,
                     "runtime.checkpoint_expired")
    shortened = _cp(spawned, 3)
    Checkpoint.objects.filter(pk=shortened.pk).update(created_at=timezone.now() - timedelta(days=8))
    Workspace.objects.update(checkpoint_max_age_days=7)
    assert_error(api.post(f"/api/agents/{spawned}/fork", {"checkpoint": shortened.pk}), 409,
                 "runtime.checkpoint_expired")
    assert Agent.objects.count() == 1  # nothing half-created


def test_zero_data_retention_has_nothing_to_fork_from(api, spawned):
    cp = _cp(spawned)
    Workspace.objects.update(zero_data_retention=True)
    assert_error(api.post(f"/api/agents/{spawned}/fork", {"checkpoint": cp.pk}), 409,
                 "runtime.checkpoint_expired")


def test_an_unreadable_prefix_is_409(api, spawned):
    head = Agent.objects.get(pk=spawned).last_seq
    assert_error(api.post(f"/api/agents/{spawned}/fork", {"at_event": head + 5}), 409,
                 "runtime.session_history_unavailable")
    assert Agent.objects.count() == 1


@pytest.mark.parametrize("body", [{}, {"checkpoint": 1, "at_event": 1}, {"at_event": 0},
                                  {"at_event": "3"}, {"checkpoint": True}, {"at_event": 1, "x": 1},
                                  {"at_event": 1, "parent": 5}])
def test_bad_bodies_are_400(api, spawned, body):
    assert_error(api.post(f"/api/agents/{spawned}/fork", body), 400)
    assert Agent.objects.count() == 1


def test_someone_elses_checkpoint_is_404(api, spawned):
    other = api.post("/api/agents", {"spec": {"model": "demo"}}).json()["id"]
    cp = _cp(other)
    assert_error(api.post(f"/api/agents/{spawned}/fork", {"checkpoint": cp.pk}), 404, "checkpoint.not_found")


def test_the_same_key_forks_once(api, spawned):
    first = api.post(f"/api/agents/{spawned}/fork", {"at_event": 1}, key="f1")
    again = api.post(f"/api/agents/{spawned}/fork", {"at_event": 1}, key="f1")
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    assert Agent.objects.count() == 2


@pytest.mark.parametrize("method, tail", [("GET", "checkpoints"), ("POST", "fork")])
def test_anonymous_outsider_and_unknown(anon, outsider_api, api, spawned, method, tail):
    assert_error(anon(method, f"/api/agents/{spawned}/{tail}"), 401)
    assert_error(outsider_api(method, f"/api/agents/{spawned}/{tail}"), 404, "agent.not_found")
    assert_error(api(method, f"/api/agents/ag_missing/{tail}"), 404, "agent.not_found")


def test_wrong_methods_are_405(api, spawned):
    assert_error(api("PUT", f"/api/agents/{spawned}/checkpoints"), 405)  # POST takes one now
    assert_error(api.get(f"/api/agents/{spawned}/fork"), 405)


# The driver reads and settles commands in database threads (database_sync_to_async):
# they see only committed rows.
@pytest.mark.django_db(transaction=True)
def test_the_worker_settles_a_fork_command_as_done(api, spawned, monkeypatch):
    """Bug 1 of issue 15: every fork logged a failure — the worker's driver had
    no act for the fork's own command ("unknown_verb", a red "Command failed ·
    fork" row). Provisioning the fork was the act: the command ends done."""
    import asyncio

    from sessions.worker import driver as driver_mod

    journal.append_many(spawned, [("turn.started", {"turn": 1}), ("message.user", {"text": "hi"})])
    r = api.post(f"/api/agents/{spawned}/fork", {"at_event": 2})
    assert r.status_code == 201, r.content
    fork, command = r.json()["id"], r.json()["command"]
    assert Command.objects.get(pk=command).verb == "fork"
    monkeypatch.setattr(driver_mod, "get_backend", lambda: None)  # no sandbox is reached here
    asyncio.run(driver_mod.AgentDriver(fork)._act_on_commands(None))
    assert Command.objects.get(pk=command).state == "done"
    assert not Event.objects.filter(agent_id=fork, type="command.failed").exists()
    assert api.get(f"/api/commands/{command}").json()["state"] == "done"
