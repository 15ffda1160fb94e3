"""Worker leases: each agent is driven by exactly one worker at a time.

A worker (the supervisor of a `manage.py serve` or `manage.py runworker`
process) drives an agent only while the agent's :class:`AgentLease` row names
it and has not expired. It renews its rows every ``ALINEO_LEASE_S / 4``; a
worker that dies stops renewing and, ``ALINEO_LEASE_S`` later, another worker
may take the agent (its driver climbs the ladder: reattach when the sandbox
still answers). A dead holder on THIS machine is recognised at once (its pid
is gone, or was reused by a process that started later), so a restarted
embedded server does not wait out its own old leases.

Two guards keep a run from being adopted while it is alive elsewhere:

* **self-fencing** — a worker that could not renew for ``0.75 × LEASE_S``
  stops its drivers before anyone else may take over;
* **the fence** — every journal write made from a driver task (see
  :func:`bind`) first re-checks, in the same transaction and under the lease
  row's lock, that this worker still holds the lease at the epoch it acquired.
  ``epoch`` grows each time the holder changes, so a worker that lost its lease
  cannot journal one more fact: :class:`LeaseLost`.

Each change of holder is journaled as ``agent.worker`` by the worker that
takes the lease, in the same transaction (sessions/worker/claims.py): this
module writes no transcript facts, so the journal may use its fence.

Clocks: expiry compares timestamps written by different machines; keep them
in sync (NTP) and the lease long against any skew (default 20 s).
"""

from __future__ import annotations

import contextvars
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import AgentLease


class LeaseLost(Exception):
    """This worker no longer holds the agent's lease: stop driving it."""

    permanent = True


@dataclass(frozen=True)
class Held:
    agent_id: str
    epoch: int
    previous: str | None = None  # the holder this worker took the lease from
    expired: bool = False  # taken after the previous holder's lease timed out
    taken: bool = False  # this acquire made this worker the holder (a new epoch)


_bound: contextvars.ContextVar[Held | None] = contextvars.ContextVar("alineo_lease", default=None)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "noboot"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None when no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""  # cannot tell: treat as alive
    return stat.rpartition(")")[2].split()[19]


def _machine() -> str:
    return f"{socket.gethostname()}/{_boot_id()}"


def _make_holder() -> str:
    """ALINEO_WORKER_ID names the worker explicitly (then a dead holder is only
    ever noticed by its lease timing out)."""
    named = settings.ALINEO_WORKER_ID.strip()
    if named:
        return named[:200]
    pid = os.getpid()
    return f"{_machine()}:{pid}:{_start_time(pid) or '0'}"


_holder: tuple[int, str] | None = None


def holder() -> str:
    """This process's worker id: machine (host name and boot id), pid, pid start time."""
    global _holder
    if _holder is None or _holder[0] != os.getpid():  # a forked child is another worker
        _holder = (os.getpid(), _make_holder())
    return _holder[1]


def holder_is_dead(name: str) -> bool:
    """True only when ``name`` is a worker on this machine whose process is gone."""
    try:
        machine, pid, started = name.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    if machine != _machine():
        return False
    now = _start_time(pid_n)
    return now is None or (now != "" and now != started)


def lease_seconds() -> float:
    return float(settings.ALINEO_LEASE_S)


# --- acquiring, renewing, releasing -------------------------------------------------------------


def acquire(agent_id: str) -> Held | None:
    """Take (or keep) the agent's lease for this worker, or None when another
    live worker holds it (or the agent does not exist). Call it in the
    transaction that journals the change of holder (``taken``)."""
    me, now = holder(), timezone.now()
    until = now + timedelta(seconds=lease_seconds())
    with transaction.atomic():
        row = AgentLease.objects.select_for_update().filter(pk=agent_id).first()
        if row is None:
            try:
                with transaction.atomic():
                    AgentLease.objects.create(agent_id=agent_id, holder=me, epoch=1,
                                              acquired_at=now, expires_at=until)
            except IntegrityError:  # another worker created it first, or no such agent
                return None
            return Held(agent_id, 1, taken=True)
        if row.holder == me:
            AgentLease.objects.filter(pk=agent_id).update(expires_at=until)
            return Held(agent_id, row.epoch)
        expired = row.expires_at <= now
        if not expired and not holder_is_dead(row.holder):
            return None
        epoch = row.epoch + 1
        AgentLease.objects.filter(pk=agent_id, holder=row.holder, epoch=row.epoch).update(
            holder=me, epoch=epoch, acquired_at=now, expires_at=until)
        return Held(agent_id, epoch, row.holder, expired and not holder_is_dead(row.holder),
                    taken=True)


def free_for_me(agent_ids: list[str]) -> list[str]:
    """Of ``agent_ids``, those this worker may try to acquire (one query):
    no lease, its own, expired, or held by a dead worker on this machine."""
    me, now = holder(), timezone.now()
    busy = {a for a, h, until in AgentLease.objects.filter(agent_id__in=agent_ids)
            .values_list("agent_id", "holder", "expires_at")
            if h != me and until > now and not holder_is_dead(h)}
    return [a for a in agent_ids if a not in busy]


def renew(agent_ids: list[str]) -> set[str]:
    """Extend this worker's leases on ``agent_ids``; the ones it still holds."""
    if not agent_ids:
        return set()
    me = holder()
    until = timezone.now() + timedelta(seconds=lease_seconds())
    with transaction.atomic():
        AgentLease.objects.filter(agent_id__in=agent_ids, holder=me).update(expires_at=until)
        return set(AgentLease.objects.filter(agent_id__in=agent_ids, holder=me)
                   .values_list("agent_id", flat=True))


def release(agent_id: str) -> None:
    """Give the lease up now (the driver ended): any worker may take it at once."""
    AgentLease.objects.filter(pk=agent_id, holder=holder()).update(expires_at=timezone.now())


# --- the fence -------------------------------------------------------------------------------------


def bind(held: Held) -> None:
    """Mark the current context (a driver task, and the threads it hands work
    to) as driving ``held.agent_id`` under its epoch: its journal writes are fenced."""
    _bound.set(held)


def bound_for(agent_id: str) -> Held | None:
    held = _bound.get()
    return held if held is not None and held.agent_id == agent_id else None


def check(held: Held) -> None:
    """Inside a transaction: lock the lease row and verify it is still ours."""
    ok = AgentLease.objects.filter(pk=held.agent_id, holder=holder(), epoch=held.epoch).update(
        epoch=held.epoch)
    if not ok:
        raise LeaseLost(f"agent {held.agent_id}: this worker no longer holds its lease "
                        f"(epoch {held.epoch})")
