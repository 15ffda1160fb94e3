"""Held credentials: POST /api/agents/{id}/approve and the "is an approval
needed now" logic read from the transcript (sessions.approvals). Approving
takes a workspace operator: staff, or the permission
agent_sessions.approve_credentials (here the owner is granted it; the
teammate is not). The attacks on it are in tests/security/test_escalation.py."""

from unittest import mock

import pytest
from django.contrib.auth.models import Group

from sessions import approvals, commands, journal
from sessions.approvals import APPROVED, REQUESTED, approval_state
from sessions.credentials import set_secret
from sessions.models import Agent, ApiToken, Command, Event
from tests.conftest import approve_permission, grant_approve

from .conftest import Caller, assert_error

pytestmark = pytest.mark.django_db

HELD = {"model": "demo", "credentials": [
    {"name": "tok", "env": "TOK", "approval": "hold"},
    {"name": "other", "env": "OTHER", "approval": "hold"},
    {"name": "free", "env": "FREE", "approval": "auto"}]}


# --- the pure logic ------------------------------------------------------------------------


def ev(seq, etype, **data):
    return {"seq": seq, "type": etype, "data": data}


def test_a_spec_without_held_bindings_never_waits():
    spec = {"credentials": [{"name": "free", "env": "FREE", "approval": "auto"}]}
    state = approval_state(spec, [])
    assert state.held == () and state.ready and not state.waiting


def test_held_bindings_need_an_approval_before_the_first_start():
    state = approval_state(HELD, [ev(1, "agent.spawned")])
    assert state.held == ("tok", "other") and state.missing == ("tok", "other")
    assert not state.ready and state.requested is None and not state.waiting


def test_a_request_then_partial_then_full_approval():
    events = [ev(1, "agent.spawned"), ev(2, REQUESTED, bindings=["tok", "other"], reason="first_start")]
    state = approval_state(HELD, events)
    assert state.waiting and state.requested["seq"] == 2 and state.requested["reason"] == "first_start"
    events.append(ev(3, APPROVED, bindings=["tok"], by="olivia"))
    state = approval_state(HELD, events)
    assert state.waiting and state.missing == ("other",)
    events.append(ev(4, APPROVED, bindings=["other"], by="olivia"))
    state = approval_state(HELD, events)
    assert state.ready and not state.waiting


def test_an_approval_counts_for_one_sandbox_start():
    events = [ev(1, "agent.spawned"), ev(2, REQUESTED, bindings=["tok", "other"]),
              ev(3, APPROVED, bindings=["tok", "other"]), ev(4, "agent.sandbox", sandbox_id="s1")]
    state = approval_state(HELD, events)
    assert not state.ready and state.requested is None  # the next start asks again
    events += [ev(5, REQUESTED, bindings=["tok", "other"], reason="sandbox_replaced")]
    state = approval_state(HELD, events)
    assert state.waiting and state.requested["reason"] == "sandbox_replaced"


def test_an_approval_without_an_open_request_counts_for_nothing():
    state = approval_state(HELD, [(1, APPROVED, {"bindings": ["tok", "other"]})])
    assert not state.ready and state.requested is None


# --- the worker's side: ensure_approved -------------------------------------------------------


@pytest.fixture
def held_agent(workspace, owner):
    set_secret(workspace, "tok", "s3cret-value")
    set_secret(workspace, "other", "other-value")
    set_secret(workspace, "free", "free-value")
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec=HELD)
    journal.append(agent.id, "agent.spawned", {"spec": HELD, "parent": None})
    return agent


def types(agent_id):
    return list(Event.objects.filter(agent_id=agent_id).order_by("seq").values_list("type", flat=True))


def test_ensure_approved_asks_once_and_says_what_it_waits_for(held_agent):
    assert approvals.ensure_approved(held_agent.id, approvals.FIRST_START) is False
    assert approvals.ensure_approved(held_agent.id, approvals.FIRST_START) is False
    assert types(held_agent.id) == ["agent.spawned", REQUESTED, "agent.status"]
    req = Event.objects.get(agent_id=held_agent.id, type=REQUESTED).data
    assert req["bindings"] == ["tok", "other"] and req["reason"] == "first_start"
    held_agent.refresh_from_db()
    assert held_agent.status == "starting"
    assert held_agent.status_reason == "waiting for approval of credential(s) tok, other"
    journal.append(held_agent.id, APPROVED, {"bindings": ["tok", "other"], "by": "olivia"})
    assert approvals.ensure_approved(held_agent.id, approvals.FIRST_START) is True


def test_a_replaced_sandbox_asks_again_and_the_status_comes_back(held_agent):
    journal.append_many(held_agent.id, [
        (REQUESTED, {"bindings": ["tok", "other"], "reason": "first_start"}),
        (APPROVED, {"bindings": ["tok", "other"], "by": "olivia"}),
        ("agent.sandbox", {"sandbox_id": "sb-1"}),
        ("agent.status", {"status": "idle", "reason": "sandbox started"})])
    assert approvals.ensure_approved(held_agent.id, approvals.SANDBOX_REPLACED) is False
    req = Event.objects.filter(agent_id=held_agent.id, type=REQUESTED).order_by("-seq").first().data
    assert req["reason"] == "sandbox_replaced" and req["previous"] == "idle"
    held_agent.refresh_from_db()
    assert (held_agent.status, held_agent.status_reason) == (
        "restoring", "waiting for approval of credential(s) tok, other")
    assert approvals.status_after_replacement(held_agent.id) == (
        "agent.status", {"status": "idle", "reason": "sandbox replaced after approval"})


def test_a_paused_agent_stays_paused_while_it_waits(held_agent):
    journal.append(held_agent.id, "agent.status", {"status": "paused", "reason": "pause by olivia"})
    assert approvals.ensure_approved(held_agent.id, approvals.FIRST_START) is False
    held_agent.refresh_from_db()
    assert held_agent.status == "paused"
    assert types(held_agent.id)[-1] == REQUESTED


def test_an_agent_with_nothing_held_is_never_stopped(workspace, owner):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    assert approvals.ensure_approved(agent.id, approvals.FIRST_START) is True
    assert types(agent.id) == []


# --- the endpoint ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _owner_operates(owner):
    """The owner is a workspace operator in these tests (granted the permission)."""
    grant_approve(owner)


@pytest.fixture
def waiting(held_agent):
    approvals.ensure_approved(held_agent.id, approvals.FIRST_START)
    return held_agent.id


def test_approve_journals_the_fact_and_wakes_the_worker(api, owner, waiting,
                                                        django_capture_on_commit_callbacks):
    with mock.patch("sessions.commands.approve.wake_worker") as wake, \
            django_capture_on_commit_callbacks(execute=True):
        r = api.post(f"/api/agents/{waiting}/approve")
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["bindings"] == ["tok", "other"] and body["waiting_for"] == []
    fact = Event.objects.get(agent_id=waiting, seq=body["seq"])
    assert fact.type == APPROVED
    assert fact.data == {"bindings": ["tok", "other"], "by": owner.username, "command": body["command"]}
    cmd = Command.objects.get(pk=body["command"])
    assert (cmd.verb, cmd.state, cmd.seq) == ("approve", "done", body["seq"])
    wake.assert_called_once_with([cmd.pk])
    assert approvals.ensure_approved(waiting, approvals.FIRST_START) is True
    # Nothing waits any more.
    assert_error(api.post(f"/api/agents/{waiting}/approve"), 409, "approval.not_requested")


def test_approve_some_bindings_then_the_rest(api, waiting):
    r = api.post(f"/api/agents/{waiting}/approve", {"bindings": ["other"]})
    assert r.status_code == 202 and r.json()["waiting_for"] == ["tok"]
    assert approvals.ensure_approved(waiting, approvals.FIRST_START) is False
    assert types(waiting).count(REQUESTED) == 1  # still the one request
    r = api.post(f"/api/agents/{waiting}/approve", {"bindings": ["tok"]})
    assert r.status_code == 202 and r.json()["waiting_for"] == []
    assert approvals.ensure_approved(waiting, approvals.FIRST_START) is True


def test_a_teammate_without_the_permission_is_a_403_and_nothing_is_written(teammate_api, waiting):
    before = (types(waiting), Command.objects.count())
    body = assert_error(teammate_api.post(f"/api/agents/{waiting}/approve/"), 403,
                        "approval.forbidden")
    assert body["permission"] == "agent_sessions.approve_credentials"
    assert "agent_sessions.approve_credentials" in body["message"]
    assert (types(waiting), Command.objects.count()) == before
    assert approvals.ensure_approved(waiting, approvals.FIRST_START) is False


def test_a_teammate_granted_the_permission_may_approve_and_is_journaled(teammate, waiting):
    teammate = grant_approve(teammate)
    r = Caller(ApiToken.issue(teammate)[1]).post(f"/api/agents/{waiting}/approve/")
    assert r.status_code == 202, r.content
    assert Event.objects.get(agent_id=waiting, type=APPROVED).data["by"] == teammate.username


def test_the_permission_may_come_from_a_group(teammate, waiting):
    operators = Group.objects.create(name="operators")
    operators.permissions.add(approve_permission())
    teammate.groups.add(operators)
    r = Caller(ApiToken.issue(teammate)[1]).post(f"/api/agents/{waiting}/approve")
    assert r.status_code == 202, r.content


def test_staff_may_approve(teammate, waiting):
    teammate.is_staff = True
    teammate.save()
    r = Caller(ApiToken.issue(teammate)[1]).post(f"/api/agents/{waiting}/approve")
    assert r.status_code == 202, r.content
    assert Event.objects.get(agent_id=waiting, type=APPROVED).data["by"] == teammate.username


def test_approve_is_idempotent_by_key(api, waiting):
    first = api.post(f"/api/agents/{waiting}/approve", key="apr-1")
    again = api.post(f"/api/agents/{waiting}/approve", key="apr-1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert types(waiting).count(APPROVED) == 1
    assert Command.objects.filter(verb="approve").count() == 1
    other = api.post(f"/api/agents/{waiting}/approve", {"bindings": ["tok"]}, key="apr-1")
    assert_error(other, 422, "idempotency.key_reused")


def test_approve_needs_authentication(anon, waiting):
    assert_error(anon.post(f"/api/agents/{waiting}/approve"), 401)
    assert types(waiting).count(APPROVED) == 0


def test_another_workspace_or_no_agent_is_a_404(outsider_api, api, waiting):
    assert_error(outsider_api.post(f"/api/agents/{waiting}/approve"), 404, "agent.not_found")
    assert_error(api.post("/api/agents/ag_nope/approve"), 404, "agent.not_found")
    assert types(waiting).count(APPROVED) == 0


def test_approve_get_is_a_405(api, waiting):
    assert api.get(f"/api/agents/{waiting}/approve").status_code == 405


def test_nothing_requested_is_a_409(api, held_agent, spawned):
    assert_error(api.post(f"/api/agents/{held_agent.id}/approve"), 409, "approval.not_requested")
    assert_error(api.post(f"/api/agents/{spawned}/approve"), 409, "approval.not_requested")


def test_bad_bodies_are_400(api, waiting):
    assert_error(api.post(f"/api/agents/{waiting}/approve", {"bindings": ["free"]}), 400,
                 "approval.unknown_binding")
    assert_error(api.post(f"/api/agents/{waiting}/approve", {"bindings": []}), 400, "request.invalid")
    assert_error(api.post(f"/api/agents/{waiting}/approve", {"bindings": "tok"}), 400, "request.invalid")
    assert_error(api.post(f"/api/agents/{waiting}/approve", {"who": "me"}), 400, "request.unknown_keys")
    assert types(waiting).count(APPROVED) == 0


def test_a_stopped_agent_cannot_be_approved(api, waiting):
    assert api.post(f"/api/agents/{waiting}/stop").status_code == 202
    assert_error(api.post(f"/api/agents/{waiting}/approve"), 409, "agent.stopped")


def test_spawn_through_the_api_then_the_worker_asks(api, workspace):
    set_secret(workspace, "tok", "s3cret-value")
    spec = {"model": "demo", "credentials": [{"name": "tok", "env": "TOK", "approval": "hold"}]}
    r = api.post("/api/agents", {"spec": spec, "prompt": "hi"})
    assert r.status_code == 201, r.content
    agent_id = r.json()["id"]
    assert_error(api.post(f"/api/agents/{agent_id}/approve"), 409, "approval.not_requested")
    assert approvals.ensure_approved(agent_id, approvals.FIRST_START) is False
    detail = api.get(f"/api/agents/{agent_id}").json()
    assert detail["status"] == "starting"
    assert detail["status_reason"] == "waiting for approval of credential(s) tok"
    assert api.post(f"/api/agents/{agent_id}/approve", {"bindings": ["tok"]}).status_code == 202
    assert approvals.ensure_approved(agent_id, approvals.FIRST_START) is True
