"""Concurrent sandboxes per workspace (sessions/worker/slots.py): the worker
claims a slot before it starts a sandbox; a full workspace makes the agent
wait, with a status that says so (journaled once); an ended or unloaded agent
holds none; two claims for the last slot cannot both win. Live, with the
driver: tests/security/test_quotas.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from sessions import journal
from sessions.models import Agent, Event, Workspace
from sessions.worker import slots
from sessions.worker.driver import MAKE_ROOM_S, IdleClock


@pytest.fixture
def make(workspace, owner):
    def make(status: str = "starting", slot: bool = False, sandbox: str = "", ws=None) -> Agent:
        agent = Agent.objects.create(workspace=ws or workspace, created_by=owner,
                                     spec={"model": "demo"}, sandbox_id=sandbox, sandbox_slot=slot)
        journal.append(agent.id, "agent.spawned", {"spec": {"model": "demo"}, "parent": None})
        if status != "starting":
            journal.append(agent.id, "agent.status", {"status": status, "reason": "test"})
        return agent

    return make


def _statuses(agent: Agent) -> list[tuple[str, str]]:
    return [(d["status"], d["reason"]) for d in Event.objects.filter(
        agent=agent, type="agent.status").order_by("seq").values_list("data", flat=True)]


@pytest.mark.django_db
def test_a_claim_within_the_quota_takes_a_slot(make, workspace):
    agent = make()
    assert slots.claim(agent.id) is True
    agent.refresh_from_db()
    assert agent.sandbox_slot and slots.in_use(workspace.pk) == 1
    assert slots.claim(agent.id) is True  # a claim again (a driver restarted) keeps it
    assert _statuses(agent) == []  # nothing to say: it did not wait


@pytest.mark.django_db
def test_a_full_workspace_makes_the_agent_wait_and_say_so_once(make, workspace):
    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    running = make(status="idle", slot=True, sandbox="sb-1")
    waiting = make()
    assert slots.claim(waiting.id) is False
    assert slots.claim(waiting.id) is False  # the next scan asks again
    waiting.refresh_from_db()
    assert not waiting.sandbox_slot and waiting.status == "starting"
    assert waiting.status_reason == (
        "waiting for a sandbox slot: 1 of 1 in use in workspace 'acme' (quota max_sandboxes; "
        "an admin raises it in the admin, Workspaces → acme → Quotas)")
    assert len(_statuses(waiting)) == 1
    assert slots.workspaces_waiting() == {workspace.pk}
    # The running one is unloaded: its slot goes to the one that waited.
    slots.release(running.id)
    assert slots.claim(waiting.id) is True
    waiting.refresh_from_db()
    assert (waiting.status, waiting.status_reason) == ("starting", slots.GRANTED)
    assert slots.workspaces_waiting() == set()


@pytest.mark.django_db
@pytest.mark.parametrize("ended", ["stopped", "lost", "unrecoverable"])
def test_an_ended_agent_holds_no_slot_and_claims_none(make, workspace, ended):
    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    gone = make(status=ended, slot=True, sandbox="sb-1")
    assert slots.in_use(workspace.pk) == 0
    assert slots.claim(gone.id) is False
    assert slots.claim(make().id) is True


@pytest.mark.django_db
def test_an_unloaded_agent_comes_back_only_into_a_free_slot(make, workspace):
    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    unloaded = make(status="idle", sandbox="sb-1")  # slot given back at unload
    make(status="idle", slot=True, sandbox="sb-2")
    assert slots.claim(unloaded.id) is False
    unloaded.refresh_from_db()
    assert unloaded.status == "idle" and unloaded.status_reason.startswith(slots.WAITING)


@pytest.mark.django_db
def test_a_paused_agent_waits_quietly(make, workspace):
    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    make(status="idle", slot=True, sandbox="sb-1")
    paused = make(status="paused")
    assert slots.claim(paused.id) is False
    paused.refresh_from_db()
    assert paused.status == "paused" and paused.status_reason == "test"


@pytest.mark.django_db
def test_slots_are_per_workspace(make, workspace, other_workspace):
    Workspace.objects.filter(pk__in=[workspace.pk, other_workspace.pk]).update(max_sandboxes=1)
    make(status="idle", slot=True, sandbox="sb-1")
    assert slots.claim(make(ws=other_workspace).id) is True


@pytest.mark.django_db(transaction=True)
def test_two_claims_for_the_last_slot_cannot_both_win(make, workspace, monkeypatch):
    """Each claim pauses between its count and its write, waiting (bounded)
    for the other to get there too — which only a missing workspace lock allows."""
    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    agents = [make(), make()]
    results: dict[str, bool] = {}
    barrier = threading.Barrier(2, timeout=2)
    count = slots.taken_by_others

    def counted_then_paused(*args):
        used = count(*args)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass  # the other one waits for our lock: go on alone
        return used

    monkeypatch.setattr(slots, "taken_by_others", counted_then_paused)

    def claim(agent_id: str) -> None:
        try:
            results[agent_id] = slots.claim(agent_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(a.id,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results.values()) == [False, True], results
    assert slots.in_use(workspace.pk) == 1


def test_an_idle_sandbox_makes_room_sooner_when_another_agent_waits(monkeypatch, settings):
    settings.ALINEO_IDLE_UNLOAD_S = 1800
    clock = IdleClock(cursor=7)
    now = [clock.since]
    monkeypatch.setattr("sessions.worker.driver.time.monotonic", lambda: now[0])
    now[0] += MAKE_ROOM_S + 1
    assert not clock.due(7) and clock.due(7, make_room=True)
    assert not clock.due(8, make_room=True)  # a new event: quiet again from now
    settings.ALINEO_IDLE_UNLOAD_S = 0  # idle unload off: only to make room
    now[0] += MAKE_ROOM_S + 1
    assert not clock.due(8) and clock.due(8, make_room=True)


@pytest.mark.django_db
def test_sandbox_sessions_hold_slots_agents_wait_for(make, workspace, owner):
    from sessions.models import SandboxSession

    Workspace.objects.filter(pk=workspace.pk).update(max_sandboxes=1)
    session = SandboxSession.objects.create(workspace=workspace, created_by=owner)
    agent = make()
    assert slots.in_use(workspace.pk) == 1
    assert slots.claim(agent.id) is False  # the session's slot counts against the quota
    SandboxSession.objects.filter(pk=session.pk).update(status="removed", sandbox_slot=False)
    assert slots.claim(agent.id) is True
