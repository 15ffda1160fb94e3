"""Concurrent sandboxes per workspace (``Workspace.max_sandboxes``).

Enforced here, where the worker is about to start a sandbox — not at spawn:
an agent beyond the quota is spawned (live agents are their own quota,
sessions/commands/quotas.py) and waits for a slot, as an agent with held
credentials waits for its approval (sessions/approvals.py).

An agent holds a slot while ``Agent.sandbox_slot`` is set and it has not
ended. The driver (sessions/worker/driver.py) calls :func:`claim` before it
creates an agent's first sandbox and before it brings back one that idle
unload stopped; :func:`release` goes with ``agent.unloaded``; stop, lost and
unrecoverable end the agent, which frees its slot without a write. A sandbox
session (sessions/commands/sandbox.py) holds a slot from create to remove. A
replacement sandbox (restore, rebuild) keeps the slot of the one it replaces.
While an agent waits, the other agents of its workspace give their slots up
sooner: an idle sandbox is unloaded after 10 s of quiet instead of
ALINEO_IDLE_UNLOAD_S (sessions/worker/driver.py MAKE_ROOM_S), and comes back
(into a free slot) with its next prompt.

A claim that finds the workspace full journals, once per wait, an
``agent.status`` whose reason says what the agent waits for, and returns
False: the driver returns, and the supervisor's next scan (every 3 s) asks
again — no exception, no backoff, no busy loop. The claim counts the holders
under the workspace row's lock, so two drivers cannot both take the last slot.
"""

from __future__ import annotations

from django.db import transaction

from sessions import journal
from sessions.models import ENDED, Agent, AgentStatus, Workspace, session_slots_in_use

WAITING = "waiting for a sandbox slot"
GRANTED = "sandbox slot granted"


def holders(workspace_id: int):
    """The workspace's agents that hold a sandbox slot."""
    return Agent.objects.filter(workspace_id=workspace_id, sandbox_slot=True).exclude(status__in=ENDED)


def in_use(workspace_id: int) -> int:
    """Slots held by agents and by sandbox sessions (sessions/commands/sandbox.py)."""
    return holders(workspace_id).count() + session_slots_in_use(workspace_id)


def taken_by_others(workspace_id: int, agent_id: str) -> int:
    return holders(workspace_id).exclude(pk=agent_id).count() + session_slots_in_use(workspace_id)


def waiting_reason(used: int, workspace: Workspace) -> str:
    return (f"{WAITING}: {used} of {workspace.max_sandboxes} in use in workspace "
            f"{workspace.name!r} (quota max_sandboxes; an admin raises it in the admin, "
            f"Workspaces → {workspace.name} → Quotas)")


def claim(agent_id: str) -> bool:
    """True when the agent holds a slot (it had one, or got one now). Blocking
    (call from a thread). Lock order: the agent, then its workspace, as a
    spawn takes them (sessions/commands/quotas.py)."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update(of=("self",)).filter(pk=agent_id).first()
        if agent is None or agent.status in ENDED:
            return False
        if agent.sandbox_slot:
            return True
        workspace = Workspace.objects.select_for_update().get(pk=agent.workspace_id)
        used = taken_by_others(workspace.pk, agent.pk)
        waiting = agent.status_reason.startswith(WAITING)
        if used < workspace.max_sandboxes:
            Agent.objects.filter(pk=agent.pk).update(sandbox_slot=True)
            if waiting:  # the status said it waits: say that it waits no more
                journal.append(agent.pk, "agent.status", {"status": agent.status,
                                                          "reason": GRANTED})
            return True
        if not waiting and agent.status != AgentStatus.PAUSED:
            journal.append(agent.pk, "agent.status", {
                "status": agent.status, "previous": agent.status,
                "reason": waiting_reason(used, workspace)})
        return False


def workspaces_waiting() -> set[int]:
    """Workspaces where an agent waits for a slot: there, the drivers unload
    idle sandboxes sooner (sessions/worker/driver.py MAKE_ROOM_S)."""
    return set(Agent.objects.filter(sandbox_slot=False, status_reason__startswith=WAITING)
               .exclude(status__in=ENDED).values_list("workspace_id", flat=True).distinct())


def release(agent_id: str) -> None:
    """The agent's sandbox stopped (idle unload): its slot is free for another.
    In the caller's transaction, with the fact that says so."""
    Agent.objects.filter(pk=agent_id).update(sandbox_slot=False)
