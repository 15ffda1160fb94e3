"""sessions.leases: one worker drives an agent at a time; a dead holder's
lease is taken over (at once on this machine, else after the timeout); a
driver that lost its lease cannot journal."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from sessions import journal, leases
from sessions.worker import claims
from sessions.models import AgentLease, Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _unbound():
    token = leases._bound.set(None)
    yield
    leases._bound.reset(token)


@pytest.fixture
def as_worker(monkeypatch):
    """Switch this process's worker identity (leases.holder())."""

    def become(name: str) -> None:
        monkeypatch.setattr(leases, "_holder", (os.getpid(), name))

    return become


def _worker_facts(agent):
    return list(Event.objects.filter(agent=agent, type="agent.worker").order_by("seq")
                .values_list("data", flat=True))


def test_a_free_agent_is_leased_at_epoch_1_and_the_transcript_says_by_whom(agent, as_worker):
    as_worker("host-a:1:1")
    held = claims.claim_one(agent.id)
    assert held == leases.Held(agent.id, 1, taken=True)
    assert _worker_facts(agent) == [{"worker": "host-a:1:1", "epoch": 1, "previous": None}]
    # Its holder acquiring again keeps the epoch and journals nothing more.
    assert claims.claim_one(agent.id).epoch == 1
    assert len(_worker_facts(agent)) == 1


def test_a_live_lease_is_not_taken_by_another_worker(agent, as_worker):
    as_worker("host-a:1:1")
    claims.claim_one(agent.id)
    as_worker("host-b:2:2")
    assert claims.claim_one(agent.id) is None
    assert leases.free_for_me([agent.id]) == []
    assert AgentLease.objects.get(pk=agent.id).holder == "host-a:1:1"


def test_an_expired_lease_is_taken_over_with_a_new_epoch(agent, as_worker):
    as_worker("host-a:1:1")
    claims.claim_one(agent.id)
    AgentLease.objects.filter(pk=agent.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    as_worker("host-b:2:2")
    assert leases.free_for_me([agent.id]) == [agent.id]
    held = claims.claim_one(agent.id)
    assert (held.epoch, held.previous, held.expired) == (2, "host-a:1:1", True)
    assert _worker_facts(agent)[-1] == {"worker": "host-b:2:2", "epoch": 2, "previous": "host-a:1:1"}


def test_a_dead_worker_on_this_machine_loses_its_lease_at_once(agent, as_worker):
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = f"{leases._machine()}:{int(child.stdout)}:12345"
    as_worker(dead)
    claims.claim_one(agent.id)  # an unexpired lease, held by a process that is gone
    assert leases.holder_is_dead(dead)
    as_worker("host-b:2:2")
    held = claims.claim_one(agent.id)
    assert (held.epoch, held.previous, held.expired) == (2, dead, False)


def test_a_live_process_on_this_machine_is_not_taken_for_dead():
    assert not leases.holder_is_dead(leases._make_holder())
    assert not leases.holder_is_dead("elsewhere/abcd:1:1")  # another machine: only the timeout tells
    assert not leases.holder_is_dead("a name without pid")


def test_renew_keeps_only_the_leases_still_held(agent, workspace, owner, as_worker):
    from sessions.models import Agent

    other = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    as_worker("host-a:1:1")
    claims.claim_one(agent.id)
    claims.claim_one(other.id)
    AgentLease.objects.filter(pk=other.id).update(holder="host-b:2:2", epoch=2)
    before = AgentLease.objects.get(pk=agent.id).expires_at
    assert leases.renew([agent.id, other.id]) == {agent.id}
    assert AgentLease.objects.get(pk=agent.id).expires_at >= before


def test_release_lets_another_worker_take_the_agent_at_once(agent, as_worker):
    as_worker("host-a:1:1")
    claims.claim_one(agent.id)
    leases.release(agent.id)
    as_worker("host-b:2:2")
    assert claims.claim_one(agent.id).epoch == 2


def test_a_driver_that_lost_its_lease_cannot_journal(agent, as_worker):
    as_worker("host-a:1:1")
    held = claims.claim_one(agent.id)
    leases.bind(held)
    journal.append(agent.id, "message.user", {"text": "while held"})
    head = journal.head(agent.id)
    # Another worker takes over (A's lease had expired while it was partitioned).
    AgentLease.objects.filter(pk=agent.id).update(holder="host-b:2:2", epoch=held.epoch + 1)
    with pytest.raises(leases.LeaseLost):
        journal.append(agent.id, "message.user", {"text": "after losing it"})
    with pytest.raises(leases.LeaseLost):
        journal.append_many(agent.id, [("turn.started", {"turn": 1})])
    assert journal.head(agent.id) == head
    leases.bind(None)  # the fence binds only driver tasks: an unbound write goes through
    journal.append(agent.id, "message.user", {"text": "from the API"})
    assert journal.head(agent.id) == head + 1


def test_the_fence_follows_a_driver_task_into_its_database_threads(agent, as_worker):
    """Drivers write through database_sync_to_async / asyncio.to_thread: the
    binding made in the task must reach those threads (contextvars are copied)."""
    import asyncio

    from channels.db import database_sync_to_async

    as_worker("host-a:1:1")
    held = claims.claim_one(agent.id)

    async def driver_task():
        leases.bind(held)
        await database_sync_to_async(journal.append)(agent.id, "message.user", {"text": "ok"})
        await database_sync_to_async(AgentLease.objects.filter(pk=agent.id).update)(
            holder="host-b:2:2", epoch=held.epoch + 1)
        with pytest.raises(leases.LeaseLost):
            await database_sync_to_async(journal.append)(agent.id, "message.user", {"text": "no"})
        with pytest.raises(leases.LeaseLost):
            await asyncio.to_thread(journal.append, agent.id, "message.user", {"text": "no"})

    asyncio.run(driver_task())
    texts = [d.get("text") for d in Event.objects.filter(agent=agent, type="message.user")
             .values_list("data", flat=True)]
    assert texts == ["ok"]
    assert leases.bound_for(agent.id) is None  # the binding stayed inside the task
