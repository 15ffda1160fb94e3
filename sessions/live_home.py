"""Looking at the live home of a running sandbox (the Files page's "Look at
the live home"; ``POST /api/agents/{id}/home-snapshot``).

The web process may not reach the engine that holds the sandbox (the worker
driving it may be on another machine), so looking is a command like any
other: journaled (``command.home_snapshot``), then acted on by the agent's
driver (sessions/worker/looks.py), which reads the home through the
backend's tar-out path — the one checkpoints use, under the same caps — into
``DATA_DIR/live-homes/<agent>/`` and journals ``agent.home_snapshot`` (a
system event). Looking never wakes a sandbox: an agent whose sandbox is not
running is refused here (409) and, should it stop between the request and the
worker, by the worker (``home_snapshot.not_running``).

A live home is NEVER a checkpoint: it has its own table (:class:`LiveHome`)
and folder, so no restore, fork, backup file copy or checkpoint retention
sees it. The newest per agent is kept, for :data:`KEEP_S`; the retention
sweep removes the expired ones (and every one of a zero-data-retention
workspace). What is in it came from the sandbox: sandboxes/home_files.py
reads it bounded, as it reads checkpoints.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

from django.db import transaction
from django.utils import timezone

from sandboxes import config

from . import journal
from .models import ENDED, UNLOADED, Agent, AgentStatus, Command, CommandState, LiveHome

log = logging.getLogger(__name__)

#: How long a live home is kept (it is a look, not a record).
KEEP_S = 3600
FACT = "agent.home_snapshot"
FAILED_FACT = "agent.home_snapshot_failed"


class Refusal(NamedTuple):
    code: str
    message: str


def refusal(status: str, reason: str, sandbox_id: str, zero_retention: bool) -> Refusal | None:
    """Why the agent's live home cannot be looked at now (None: its sandbox
    should be running). The decision the web process and the worker share."""
    if zero_retention:
        return Refusal("home_snapshot.zero_data_retention",
                       "This agent's workspace keeps no data (zero data retention): no copy "
                       "of its home is stored, not even for a look.")
    if status in ENDED:
        return Refusal("home_snapshot.not_running",
                       f"The agent is {status}: its sandbox has ended. Its checkpoints, if any, "
                       "show its home.")
    if not sandbox_id or status == AgentStatus.STARTING:
        return Refusal("home_snapshot.no_sandbox",
                       "The agent has no sandbox yet: there is no live home to look at.")
    if status == AgentStatus.RESTORING:
        return Refusal("home_snapshot.not_running",
                       "The agent's sandbox is being brought back; look again in a moment.")
    if stopped_on_purpose(status, reason):
        return Refusal("home_snapshot.not_running",
                       "The agent's sandbox was stopped after it sat idle (unloaded), and looking "
                       "never wakes a sandbox: its newest checkpoint shows its home, and a prompt "
                       "brings the sandbox back.")
    return None


def stopped_on_purpose(status: str, reason: str) -> bool:
    """Idle unload stopped the sandbox (sessions/worker/driver.py)."""
    return status == AgentStatus.IDLE and reason == UNLOADED


def refusal_for(agent: Agent) -> Refusal | None:
    status, reason = journal.effective_status(agent)
    return refusal(status, reason, agent.sandbox_id, agent.workspace.zero_data_retention)


def root() -> Path:
    return config.data_dir().live_homes


def newest(agent_id: str, now=None) -> LiveHome | None:
    """The agent's live home that may still be shown: not removed, not expired,
    its file present."""
    row = (LiveHome.objects.filter(agent_id=agent_id, deleted_at=None,
                                   expires_at__gt=now or timezone.now())
           .order_by("-created_at", "-id").first())
    return row if row is not None and Path(row.path).is_file() else None


def record(agent_id: str, sandbox_id: str, turn: int, stored, command_id: int) -> LiveHome:
    """The row, the command's outcome and ``agent.home_snapshot`` in one
    transaction (then :func:`keep_only` it)."""
    now = timezone.now()
    with transaction.atomic():
        through = Agent.objects.filter(pk=agent_id).values_list("last_seq", flat=True).first() or 0
        row = LiveHome.objects.create(
            agent_id=agent_id, command_id=command_id, sandbox_id=sandbox_id, turn=turn,
            through_seq=through, path=str(stored.path), bytes=stored.bytes, duration_ms=stored.ms,
            expires_at=now + timedelta(seconds=KEEP_S))
        fact = {"live_home": row.pk, "command": command_id, "sandbox_id": sandbox_id,
                "turn": turn, "bytes": stored.bytes, "ms": stored.ms}
        Command.objects.filter(pk=command_id, state=CommandState.PENDING).update(
            state=CommandState.DONE, acted_at=now, result=fact)
        journal.append(agent_id, FACT, fact)
    return row


def keep_only(row: LiveHome) -> int:
    """The agent's older live homes go: the newest is the one kept."""
    return drop(LiveHome.objects.filter(agent_id=row.agent_id, deleted_at=None)
                .exclude(pk=row.pk))


def drop(rows) -> int:
    """Delete the files of these live homes (only inside ``live-homes/``) and
    mark them removed; returns how many."""
    rows = list(rows)
    base = root().resolve()
    for row in rows:
        target = Path(row.path).resolve()
        if base in target.parents:
            target.unlink(missing_ok=True)
        else:
            log.warning("not deleting %s: outside %s", target, base)
    if rows:
        LiveHome.objects.filter(pk__in=[r.pk for r in rows], deleted_at=None).update(
            deleted_at=timezone.now())
    return len(rows)


def sweep(now=None) -> int:
    """Expired live homes, and every one of a zero-data-retention workspace."""
    now = now or timezone.now()
    live = LiveHome.objects.filter(deleted_at=None)
    return drop(live.filter(expires_at__lte=now)) + drop(
        live.filter(agent__workspace__zero_data_retention=True))
