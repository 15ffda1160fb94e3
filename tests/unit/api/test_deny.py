"""POST /api/agents/{id}/deny: an operator refuses the held credentials an
agent waits for, with a reason (required). Who and why are journaled
(credential.denied); the request is closed, the worker is woken and finds the
denial (sessions.approvals.denial: the agent.lost reason). Operator-only, like
approving; 401/403/404 and bad bodies write nothing."""

import pytest

from sessions import approvals
from sessions.approvals import APPROVED, DENIED, REQUESTED, approval_state
from sessions.models import ApiToken, Command, Event
from tests.conftest import grant_approve

from .conftest import Caller, assert_error
from .test_approvals import HELD, ev, held_agent, types  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db


def test_a_denial_closes_the_request_and_no_later_approval_counts():
    events = [ev(1, "agent.spawned"), ev(2, REQUESTED, bindings=["tok", "other"]),
              ev(3, DENIED, bindings=["tok", "other"], by="opal", reason="no")]
    state = approval_state(HELD, events)
    assert not state.waiting and not state.ready and state.denied["seq"] == 3
    state = approval_state(HELD, events + [ev(4, APPROVED, bindings=["tok", "other"])])
    assert not state.ready and state.denied is not None
    assert approvals.denial_reason(state.denied) == "credential(s) tok, other denied by opal: no"


def test_a_denial_before_any_request_counts_for_nothing():
    state = approval_state(HELD, [ev(1, DENIED, bindings=["tok"], by="x", reason="y")])
    assert state.denied is None


@pytest.fixture
def waiting(held_agent, owner):  # noqa: F811
    grant_approve(owner)
    approvals.ensure_approved(held_agent.id, approvals.FIRST_START)
    return held_agent.id


def test_deny_journals_who_and_why_and_the_worker_finds_it(api, owner, waiting):
    r = api.post(f"/api/agents/{waiting}/deny", {"reason": "  not for this repo  "})
    assert r.status_code == 202, r.content
    body = r.json()
    fact = Event.objects.get(agent_id=waiting, seq=body["seq"])
    assert fact.type == DENIED and fact.data == {
        "bindings": ["tok", "other"], "by": owner.username, "reason": "not for this repo",
        "command": body["command"]}
    assert Command.objects.get(pk=body["command"]).verb == "deny"
    # The worker's next look: not approved, not asked again, and why it must end.
    assert approvals.ensure_approved(waiting, approvals.FIRST_START) is False
    assert types(waiting).count(REQUESTED) == 1
    assert approvals.denial(waiting) == (
        f"credential(s) tok, other denied by {owner.username}: not for this repo")
    # Nothing waits any more: neither approve nor deny again.
    assert_error(api.post(f"/api/agents/{waiting}/approve"), 409, "approval.not_requested")
    assert_error(api.post(f"/api/agents/{waiting}/deny", {"reason": "x"}), 409,
                 "approval.not_requested")


def test_an_agent_that_waits_has_no_denial(waiting):
    assert approvals.denial(waiting) is None
    assert approvals.denial("ag_nope") is None


def test_deny_is_idempotent_by_key(api, waiting):
    first = api.post(f"/api/agents/{waiting}/deny", {"reason": "r"}, key="den-1")
    again = api.post(f"/api/agents/{waiting}/deny", {"reason": "r"}, key="den-1")
    assert first.status_code == again.status_code == 202 and again.json() == first.json()
    assert types(waiting).count(DENIED) == 1
    assert_error(api.post(f"/api/agents/{waiting}/deny", {"reason": "other"}, key="den-1"),
                 422, "idempotency.key_reused")


def test_a_reason_is_required_and_bounded(api, waiting):
    for body in ({}, {"reason": "   "}, {"reason": 7}, {"reason": "r" * 501}):
        assert_error(api.post(f"/api/agents/{waiting}/deny", body), 400, "request.invalid")
    assert_error(api.post(f"/api/agents/{waiting}/deny", {"reason": "r", "bindings": ["tok"]}),
                 400, "request.unknown_keys")
    assert types(waiting).count(DENIED) == 0


def test_deny_needs_authentication(anon, waiting):
    assert_error(anon.post(f"/api/agents/{waiting}/deny", {"reason": "r"}), 401)
    assert types(waiting).count(DENIED) == 0


def test_a_teammate_who_is_not_an_operator_is_a_403(teammate_api, waiting):
    body = assert_error(teammate_api.post(f"/api/agents/{waiting}/deny", {"reason": "r"}), 403,
                        "approval.forbidden")
    assert body["permission"] == "agent_sessions.approve_credentials"
    assert types(waiting).count(DENIED) == 0 and not Command.objects.filter(verb="deny").exists()


def test_a_teammate_granted_the_permission_may_deny(teammate, waiting):
    r = Caller(ApiToken.issue(grant_approve(teammate))[1]).post(
        f"/api/agents/{waiting}/deny", {"reason": "r"})
    assert r.status_code == 202, r.content


def test_another_workspace_or_no_agent_is_a_404(outsider_api, api, waiting):
    assert_error(outsider_api.post(f"/api/agents/{waiting}/deny", {"reason": "r"}), 404,
                 "agent.not_found")
    assert_error(api.post("/api/agents/ag_nope/deny", {"reason": "r"}), 404, "agent.not_found")
    assert types(waiting).count(DENIED) == 0


def test_deny_get_is_a_405(api, waiting):
    assert api.get(f"/api/agents/{waiting}/deny").status_code == 405
