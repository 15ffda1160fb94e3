"""POST /api/agents/{id}/home-snapshot (look at the live home of a RUNNING
sandbox: a command, 202) and GET (the newest look's metadata): 409 when the
sandbox is not running — nothing written, nothing woken —, 4xx JSON for bad
input, 401/403/404 with the shared actors."""

import pytest
from django.test import Client
from django.utils import timezone

from sessions.models import Agent, Command, Event, LiveHome, UNLOADED, Workspace
from tests.unit.test_home_files import make_checkpoint

from .conftest import assert_error

pytestmark = pytest.mark.django_db

PATH = "/api/agents/{}/home-snapshot"


def _set(agent_id, **kw):
    Agent.objects.filter(pk=agent_id).update(**kw)


@pytest.fixture
def running(spawned):
    _set(spawned, sandbox_id="sb-live", status="running")
    return spawned


def _written(agent_id):
    return Command.objects.count(), Agent.objects.get(pk=agent_id).last_seq


def test_a_look_is_a_journaled_idempotent_command(api, running):
    r = api.post(PATH.format(running), {}, key="look-1")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["verb"] == "home_snapshot" and body["state"] == "pending"
    assert Event.objects.get(agent_id=running, seq=body["seq"]).type == "command.home_snapshot"
    again = api.post(PATH.format(running), {}, key="look-1")
    assert again.json() == body and Command.objects.filter(verb="home_snapshot").count() == 1
    assert api.get(f"/api/commands/{body['command']}").json()["state"] == "pending"


@pytest.mark.parametrize("changes, code", [
    ({"status": "idle", "status_reason": UNLOADED}, "home_snapshot.not_running"),
    ({"status": "restoring"}, "home_snapshot.not_running"),
    ({"sandbox_id": "", "status": "starting"}, "home_snapshot.no_sandbox"),
    ({"status": "stopped"}, "agent.stopped"),
])
def test_a_sandbox_that_is_not_running_is_409_and_nothing_is_written(api, running, changes, code):
    _set(running, **changes)
    before = _written(running)
    assert_error(api.post(PATH.format(running), {}), 409, code)
    assert _written(running) == before


def test_zero_data_retention_is_409(api, running):
    Workspace.objects.filter(agents__id=running).update(zero_data_retention=True)
    assert_error(api.post(PATH.format(running), {}), 409, "home_snapshot.zero_data_retention")


def test_bad_bodies_are_400_and_write_nothing(api, running):
    before = _written(running)
    assert_error(api.post(PATH.format(running), {"path": "/"}), 400, "request.unknown_keys")
    assert_error(api.post(PATH.format(running), [1]), 400, "request.invalid")
    assert_error(api.post(PATH.format(running), raw=b"{nope"), 400, "request.malformed_json")
    assert_error(api.post(PATH.format(running), {}, key=""), 400, "idempotency.key_invalid")
    assert _written(running) == before


def test_get_shows_the_newest_look_metadata_only(api, teammate_api, running, tmp_path):
    assert_error(api.get(PATH.format(running)), 404, "home_snapshot.none")
    path = make_checkpoint(tmp_path / "l.tar.zst", {"./secret.txt": "contents"})
    row = LiveHome.objects.create(agent_id=running, sandbox_id="sb-live", turn=3, path=str(path),
                                  bytes=9, expires_at=timezone.now() + timezone.timedelta(hours=1))
    body = teammate_api.get(PATH.format(running)).json()["home_snapshot"]
    assert body["id"] == row.pk and body["turn"] == 3 and body["sandbox_id"] == "sb-live"
    assert "contents" not in str(body) and "path" not in body
    LiveHome.objects.filter(pk=row.pk).update(expires_at=timezone.now())
    assert_error(api.get(PATH.format(running)), 404, "home_snapshot.none")
    # never a checkpoint
    assert api.get(f"/api/agents/{running}/checkpoints").json()["checkpoints"] == []


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_anonymous_csrf_outsider_and_unknown(anon, outsider_api, api, owner, running, method):
    path = PATH.format(running)
    assert_error(anon(method, path, {}), 401, "auth.required")
    if method == "POST":
        session = Client(enforce_csrf_checks=True)
        session.force_login(owner)
        assert_error(session.post(path, b"{}", content_type="application/json"), 403,
                     "auth.csrf_failed")
    assert_error(outsider_api(method, path, {}), 404, "agent.not_found")
    assert_error(api(method, PATH.format("ag_missing"), {}), 404, "agent.not_found")
    assert not Command.objects.filter(verb="home_snapshot").exists()


def test_other_methods_are_405(api, running):
    assert_error(api("PUT", PATH.format(running), {}), 405)
