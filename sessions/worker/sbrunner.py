"""The worker's side of sandbox sessions: one task per session with pending
commands, acting on them in id order (sessions/worker/sbops.py), while this
worker holds the session's lease (``SandboxSession.lease_holder``). The
supervisor (sessions/worker/supervisor.py) calls :meth:`SessionRunner.scan`
on each of its scans; a command's wake-up kicks it like an agent's.

Blocking work runs in threads of their own (``thread_sensitive=False``), so
a long exec holds neither the serving loop nor the thread other database
work shares. A lease another live worker holds is left alone; a dead holder
on this machine (a kill -9) is taken over at once, and its exec that was
running is reported, never run again (sbops.py).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from sessions import leases
from sessions.models import Command, CommandState, SandboxSession

from . import sbops

log = logging.getLogger(__name__)

RETRY_S = 3.0


def claim(session_id: str) -> bool:
    """Take (or keep) the session's lease for this worker; False when another live worker has it."""
    me, now = leases.holder(), timezone.now()
    with transaction.atomic():
        row = (SandboxSession.objects.select_for_update().filter(pk=session_id)
               .values("lease_holder", "lease_expires").first())
        if row is None:
            return False
        other = row["lease_holder"] not in ("", me)
        if other and row["lease_expires"] and row["lease_expires"] > now \
                and not leases.holder_is_dead(row["lease_holder"]):
            return False
        SandboxSession.objects.filter(pk=session_id).update(
            lease_holder=me, lease_expires=now + timedelta(seconds=leases.lease_seconds()))
        return True


def renew(session_id: str) -> bool:
    until = timezone.now() + timedelta(seconds=leases.lease_seconds())
    return bool(SandboxSession.objects.filter(pk=session_id, lease_holder=leases.holder())
                .update(lease_expires=until))


def release(session_id: str) -> None:
    SandboxSession.objects.filter(pk=session_id, lease_holder=leases.holder()).update(
        lease_expires=timezone.now())


def with_work() -> list[str]:
    return sorted(set(Command.objects.filter(state=CommandState.PENDING,
                                             sandbox_session__isnull=False)
                      .values_list("sandbox_session_id", flat=True)))


def next_pending(session_id: str) -> int | None:
    return (Command.objects.filter(sandbox_session_id=session_id, state=CommandState.PENDING)
            .order_by("id").values_list("id", flat=True).first())


class SessionRunner:
    def __init__(self):
        self.tasks: dict[str, asyncio.Task] = {}

    async def scan(self) -> None:
        try:
            await self._scan()
        except Exception:  # noqa: BLE001 - the agents' scan goes on; the next scan retries
            log.exception("sandbox session scan failed")

    async def _scan(self) -> None:
        for session_id in await database_sync_to_async(with_work)():
            task = self.tasks.get(session_id)
            if task is not None and not task.done():
                continue
            if await database_sync_to_async(claim)(session_id):
                self.tasks[session_id] = asyncio.get_running_loop().create_task(
                    self.run(session_id), name=f"sandbox-session-{session_id}")

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self, session_id: str) -> None:
        keeper = asyncio.get_running_loop().create_task(self._keep_lease(session_id))
        holder = leases.holder()
        act = database_sync_to_async(sbops.act, thread_sensitive=False)
        try:
            while (command_id := await database_sync_to_async(next_pending)(session_id)):
                if keeper.done():
                    return  # the lease is lost: another worker acts now
                try:
                    await act(session_id, command_id, holder)
                except Exception as exc:  # noqa: BLE001 - an engine away: try again later
                    log.warning("sandbox session %s: command %s: %s; again in %.0f s",
                                session_id, command_id, exc, RETRY_S)
                    await asyncio.sleep(RETRY_S)
                    return
        finally:
            keeper.cancel()
            await database_sync_to_async(release)(session_id)

    async def _keep_lease(self, session_id: str) -> None:
        while True:
            await asyncio.sleep(leases.lease_seconds() / 4)
            if not await database_sync_to_async(renew)(session_id):
                log.warning("sandbox session %s: this worker lost its lease", session_id)
                return
