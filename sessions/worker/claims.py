"""Taking and giving up agents' leases for this worker (sessions/leases.py
keeps the lease rows and the fence). Each change of holder is journaled as
``agent.worker {worker, epoch, previous}`` in the same transaction as the
lease change, so the transcript shows which worker drove which stretch of it."""

from __future__ import annotations

from django.db import transaction

from sessions import journal, leases


def claim(agent_ids: list[str]) -> list[leases.Held]:
    """The leases this worker gets of ``agent_ids`` (taken, kept or taken over)."""
    out = []
    for agent_id in leases.free_for_me(agent_ids):
        held = claim_one(agent_id)
        if held is not None:
            out.append(held)
    return out


def claim_one(agent_id: str) -> leases.Held | None:
    with transaction.atomic():
        held = leases.acquire(agent_id)
        if held is not None and held.taken:
            journal.append(agent_id, "agent.worker", {"worker": leases.holder(),
                                                      "epoch": held.epoch,
                                                      "previous": held.previous})
    return held


def release_all(agent_ids: list[str]) -> None:
    for agent_id in agent_ids:
        leases.release(agent_id)
