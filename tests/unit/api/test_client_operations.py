"""The client's endpoints: POST /api/agents/{id}/reattach, …/rebridge,
…/checkpoints (take one now) and GET /api/commands/{id} (a command's outcome):
journaled like every command, idempotent, workspace-scoped, JSON errors."""

import pytest
from django.test import Client

from sessions import journal
from sessions.models import Agent, Command, Event, Workspace

from .conftest import assert_error

pytestmark = pytest.mark.django_db

CHECKPOINTED = {"model": "demo", "checkpoint": True}


@pytest.fixture
def checkpointed(api):
    r = api.post("/api/agents", {"spec": CHECKPOINTED})
    assert r.status_code == 201, r.content
    return r.json()["id"]


POSTS = ["reattach", "rebridge", "checkpoints"]


@pytest.mark.parametrize("verb", ["reattach", "rebridge"])
def test_reattach_and_rebridge_are_journaled_commands(api, spawned, verb):
    r = api.post(f"/api/agents/{spawned}/{verb}", {}, key=f"{verb}-1")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["verb"] == verb and body["state"] == "pending" and body["agent"] == spawned
    cmd = Command.objects.get(pk=body["command"])
    assert cmd.verb == verb and cmd.state == "pending" and cmd.result == {}
    fact = Event.objects.get(agent_id=spawned, seq=body["seq"])
    assert fact.type == f"command.{verb}" and fact.data["command"] == cmd.pk


def test_the_same_key_is_one_command(api, spawned):
    first = api.post(f"/api/agents/{spawned}/reattach", {}, key="k-1")
    again = api.post(f"/api/agents/{spawned}/reattach", {}, key="k-1")
    assert first.status_code == again.status_code == 202
    assert first.json() == again.json() and again["Idempotent-Replayed"] == "true"
    assert Command.objects.filter(verb="reattach").count() == 1
    assert_error(api.post(f"/api/agents/{spawned}/reattach", {"reason": "other"}, key="k-1"),
                 422, "idempotency.key_reused")


def test_bad_bodies_are_400(api, spawned):
    assert_error(api.post(f"/api/agents/{spawned}/reattach", {"text": "x"}), 400,
                 "request.unknown_keys")
    assert_error(api.post(f"/api/agents/{spawned}/rebridge", [1]), 400, "request.invalid")
    assert_error(api.post(f"/api/agents/{spawned}/checkpoints", raw=b"{nope"), 400,
                 "request.malformed_json")


def test_a_checkpoint_is_taken_only_when_the_spec_asks_for_them(api, spawned, checkpointed):
    assert_error(api.post(f"/api/agents/{spawned}/checkpoints", {}), 409, "checkpoint.disabled")
    r = api.post(f"/api/agents/{checkpointed}/checkpoints", {}, key="cp-1")
    assert r.status_code == 202, r.content
    assert r.json()["verb"] == "checkpoint"
    assert Event.objects.get(agent_id=checkpointed, seq=r.json()["seq"]).type == "command.checkpoint"
    # GET still lists
    assert api.get(f"/api/agents/{checkpointed}/checkpoints").json()["checkpoints"] == []


def test_zero_data_retention_takes_no_checkpoint(api, checkpointed):
    Workspace.objects.filter(agents__id=checkpointed).update(zero_data_retention=True)
    assert_error(api.post(f"/api/agents/{checkpointed}/checkpoints", {}), 409,
                 "checkpoint.zero_data_retention")


@pytest.mark.parametrize("verb", POSTS)
def test_an_ended_agent_is_409(api, checkpointed, verb):
    api.post(f"/api/agents/{checkpointed}/stop", {})
    assert_error(api.post(f"/api/agents/{checkpointed}/{verb}", {}), 409, "agent.stopped")


@pytest.mark.parametrize("verb", POSTS)
def test_anonymous_csrf_outsider_and_unknown(anon, outsider_api, api, owner, checkpointed, verb):
    path = f"/api/agents/{checkpointed}/{verb}"
    assert_error(anon.post(path, {}), 401, "auth.required")
    session = Client(enforce_csrf_checks=True)
    session.force_login(owner)
    assert_error(session.post(path, b"{}", content_type="application/json"), 403,
                 "auth.csrf_failed")
    assert_error(outsider_api.post(path, {}), 404, "agent.not_found")
    assert_error(api.post(f"/api/agents/ag_missing/{verb}", {}), 404, "agent.not_found")
    assert not Command.objects.filter(verb__in=("reattach", "rebridge", "checkpoint")).exists()


def test_wrong_methods_are_405(api, spawned):
    assert_error(api.get(f"/api/agents/{spawned}/reattach"), 405)
    assert_error(api.post(f"/api/commands/{Command.objects.first().pk}"), 405)


# --- GET /api/commands/{id} ---------------------------------------------------------


def test_a_command_shows_its_state_and_result(api, teammate_api, spawned):
    cid = api.post(f"/api/agents/{spawned}/reattach", {}).json()["command"]
    body = api.get(f"/api/commands/{cid}").json()
    assert body["id"] == cid and body["agent"] == spawned and body["verb"] == "reattach"
    assert body["state"] == "pending" and body["result"] == {} and body["acted_at"] is None
    Command.objects.filter(pk=cid).update(state="done", result={"rung": "reattach",
                                                                "sandbox_id": "sb-1"})
    body = teammate_api.get(f"/api/commands/{cid}").json()  # the workspace's, not only its author's
    assert body["state"] == "done" and body["result"] == {"rung": "reattach", "sandbox_id": "sb-1"}


def test_a_command_failed_by_the_worker_says_why(api, spawned):
    cid = api.post(f"/api/agents/{spawned}/steer", {"text": "go"}).json()["command"]
    Command.objects.filter(pk=cid).update(state="failed")
    journal.append(spawned, "command.failed", {"command": cid, "verb": "steer", "code": "no_turn",
                                              "reason": "no turn was running"})
    body = api.get(f"/api/commands/{cid}").json()
    assert body["state"] == "failed"
    assert body["result"] == {"code": "no_turn", "message": "no turn was running"}


def test_commands_are_workspace_scoped(anon, outsider_api, api, spawned):
    cid = api.post(f"/api/agents/{spawned}/reattach", {}).json()["command"]
    assert_error(anon.get(f"/api/commands/{cid}"), 401, "auth.required")
    assert_error(outsider_api.get(f"/api/commands/{cid}"), 404, "command.not_found")
    for bad in ("999999", "abc", "1e3", "-1", "9" * 40):
        assert_error(api.get(f"/api/commands/{bad}"), 404, "command.not_found")
    assert Agent.objects.filter(pk=spawned).exists()
