"""The supervisor: one per process, on the serving loop; it keeps one
:class:`sessions.worker.driver.AgentDriver` task per agent that has work.

An agent has work when it has pending Command rows, or when it has a sandbox
and has not ended (its bridge may be running turns or holding unjournaled
events). **Boot recovery**: the first scan starts a driver for every such
agent, and a driver's first act is :func:`sessions.worker.ladder.recover` — reattach
(journaled as ``agent.restored {rung: reattach, reason:
control_plane_restart}``), resume, restart, restore, rebuild or lost — before
it acts on any command. The **watcher** (every ``WATCH_S``) lists the
backend's sandboxes once and sends the ladder to agents whose sandbox is not
running, without waiting for a prompt or a driver's backoff. The scan runs at start, on every
wake-up (``kick()``, from the worker consumer on ``command.pending``) and every
``SCAN_S`` seconds as a safety net, because wake-ups are best effort. A driver
that fails is started again after a backoff (1 s doubling to 60 s). Each scan
also tells the drivers whether an agent of their workspace waits for a
sandbox slot (sessions/worker/slots.py), so an idle one makes room sooner.

Never two drivers for one agent in a process; across processes (several
workers) a driver starts only once this worker holds the agent's lease
(sessions/leases.py, taken in sessions/worker/claims.py), renewed by the heartbeat task every quarter of
``ALINEO_LEASE_S``. A lease that could not be renewed stops its driver; a
driver's journal writes are fenced by the lease, and the relay's cursor guard
refuses a second writer as well.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from sandboxes.backends import get_backend
from sandboxes.backends.base import SandboxStatus
from sessions import backup, leases
from sessions.models import ENDED, Agent, Command, CommandState

from . import claims, retention, slots
from .driver import UNLOADED, AgentDriver
from .sbrunner import SessionRunner

log = logging.getLogger(__name__)

SCAN_S = 3.0
WATCH_S = 3.0
BACKOFF_MAX_S = 60.0

_current: Supervisor | None = None


class Supervisor:
    def __init__(self):
        self.drivers: dict[str, asyncio.Task] = {}
        self.objects: dict[str, AgentDriver] = {}
        self.failures: dict[str, tuple[int, float]] = {}  # agent → (count, not before)
        self.driven: set[str] = set()  # agents this process has driven (boot recovery is over for them)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.next_watch = 0.0
        self.next_sweep = 0.0  # the first scan sweeps: a policy changed while down applies at boot
        self.chores: asyncio.Task | None = None
        self.heartbeat: asyncio.Task | None = None
        self.sandbox_sessions = SessionRunner()  # scripts' sandboxes (sessions/worker/sbrunner.py)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task:
        loop = loop or asyncio.get_event_loop()
        self.task = loop.create_task(self._main(), name="supervisor")
        self.heartbeat = loop.create_task(self._heartbeat(), name="lease-heartbeat")
        return self.task

    def kick(self) -> None:
        self.wake.set()

    async def _main(self) -> None:
        try:
            while True:
                try:
                    await self.scan()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("supervisor scan failed")
                try:
                    await asyncio.wait_for(self.wake.wait(), SCAN_S)
                except TimeoutError:
                    pass
                self.wake.clear()
        finally:
            await self.stop_drivers()

    async def stop_drivers(self) -> None:
        tasks = list(self.drivers.values()) + [t for t in (self.chores, self.heartbeat) if t]
        held = self.held()
        await self.sandbox_sessions.stop()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if held:  # a clean stop: other workers may take these agents at once
            try:
                await database_sync_to_async(claims.release_all)(held)
            except Exception:  # noqa: BLE001 - they expire by themselves
                log.info("could not release %d leases at stop", len(held), exc_info=True)

    def held(self) -> list[str]:
        """The agents whose leases this worker keeps: driving or backing off."""
        return sorted(set(self.drivers) | set(self.failures))

    async def _heartbeat(self) -> None:
        """Renew this worker's leases every quarter of ALINEO_LEASE_S. A lease
        found taken stops its driver; when renewals fail for 3/4 of the lease,
        every driver stops before another worker may take over (self-fencing)."""
        last_ok = time.monotonic()
        while True:
            lease_s = leases.lease_seconds()
            await asyncio.sleep(lease_s / 4)
            wanted = self.held()
            try:
                kept = await database_sync_to_async(leases.renew)(wanted)
            except Exception as exc:  # noqa: BLE001 - the database may be away for a moment
                log.warning("lease renewal failed: %s", exc)
                if time.monotonic() - last_ok > 0.75 * lease_s:
                    log.error("leases not renewed for %.0f s: stopping every driver",
                              time.monotonic() - last_ok)
                    for agent_id in wanted:
                        self._drop(agent_id)
                continue
            last_ok = time.monotonic()
            for agent_id in set(wanted) - kept:
                log.warning("agent %s: this worker lost its lease; its driver stops", agent_id)
                self._drop(agent_id)

    def _drop(self, agent_id: str) -> None:
        task = self.drivers.pop(agent_id, None)
        self.objects.pop(agent_id, None)
        self.failures.pop(agent_id, None)
        if task is not None:
            task.cancel()

    async def scan(self) -> None:
        now = time.monotonic()
        to_start = []
        crowded = await _workspaces_waiting()
        for agent_id in await _agents_with_work():
            driver = self.objects.get(agent_id)
            if agent_id in self.drivers and driver is not None:
                if driver.healthy:
                    self.failures.pop(agent_id, None)  # it recovered: the backoff starts over
                if driver.info is not None:
                    driver.room_wanted(driver.info.workspace_id in crowded)
                driver.kick()
                continue
            _count, not_before = self.failures.get(agent_id, (0, 0.0))
            if now < not_before:
                continue
            to_start.append(agent_id)
        await self._claim_and_start(to_start)
        await self.sandbox_sessions.scan()
        if now >= self.next_watch:
            self.next_watch = now + WATCH_S
            await self.watch()
        if now >= self.next_sweep and (self.chores is None or self.chores.done()):
            self.next_sweep = now + settings.ALINEO_SWEEP_S
            # A task of its own: a long backup must not hold up new commands.
            self.chores = asyncio.get_running_loop().create_task(self.housekeeping(), name="housekeeping")

    async def housekeeping(self) -> None:
        """The retention sweep, orphaned host-dir homes (and, when configured, a
        scheduled backup), off the loop."""
        try:
            await database_sync_to_async(retention.sweep)()
        except Exception:
            log.exception("retention sweep failed")
        try:  # host-dir homes whose container was removed behind our back (docker rm -f)
            await asyncio.to_thread(get_backend().sweep_homes)
        except Exception as exc:  # noqa: BLE001 - the engine may be down: the next sweep
            log.info("host home sweep skipped: %s", exc)
        if settings.ALINEO_BACKUP_DIR:
            await asyncio.to_thread(backup.run_scheduled_if_due)  # never raises; logs a failure

    async def watch(self) -> None:
        """The watcher: agents that should be running whose sandbox is not
        (removed, exited) get their driver's ladder now — no prompt needed,
        no backoff wait."""
        backend = get_backend()
        # Sandboxes on other engines are watched by the workers that drive them.
        live = [(a, sid) for a, sid, host in await _live_agents() if host in ("", backend.host)]
        if not live:
            return
        try:
            handles = await asyncio.to_thread(backend.list)
        except Exception as exc:  # noqa: BLE001 - the engine may be down: nothing to tell now
            log.info("watcher: cannot list sandboxes: %s", exc)
            return
        states = {h.id: h.status for h in handles}
        lost = []
        for agent_id, sandbox_id in live:
            state = states.get(sandbox_id, SandboxStatus.MISSING)
            if state is SandboxStatus.RUNNING:
                continue
            driver = self.objects.get(agent_id)
            if agent_id in self.drivers and driver is not None:
                driver.sandbox_gone()
            else:
                lost.append(agent_id)
        for agent_id in lost:
            self.failures.pop(agent_id, None)  # no backoff wait for a sandbox known gone
        for agent_id in await self._claim_and_start(lost):
            log.info("watcher: agent %s: its sandbox is not running here: recovering now", agent_id)

    async def _claim_and_start(self, agent_ids: list[str]) -> list[str]:
        """Start a driver for each of ``agent_ids`` whose lease this worker gets."""
        if not agent_ids:
            return []
        claimed = await database_sync_to_async(claims.claim)(agent_ids)
        for held in claimed:
            if held.agent_id not in self.drivers:
                self._start_driver(held)
        return [h.agent_id for h in claimed]

    def _start_driver(self, held: leases.Held) -> None:
        agent_id = held.agent_id
        driver = AgentDriver(agent_id, boot=agent_id not in self.driven, lease=held)
        self.driven.add(agent_id)
        task = asyncio.get_running_loop().create_task(driver.run(), name=f"driver-{agent_id}")
        self.drivers[agent_id] = task
        self.objects[agent_id] = driver
        task.add_done_callback(lambda t, a=agent_id: self._ended(a, t))

    def _ended(self, agent_id: str, task: asyncio.Task) -> None:
        driver = self.objects.get(agent_id)
        if self.drivers.get(agent_id) is task:
            del self.drivers[agent_id]
            self.objects.pop(agent_id, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            # The lease is not released but left to expire: this worker takes it
            # back silently at its next scan if work arrives, whereas a release
            # would let agents that wait (an approval) change hands every scan.
            self.failures.pop(agent_id, None)
            if driver is not None and driver.served:
                self.kick()  # a command that came in while it wound down (an unload) goes now
            return
        if isinstance(exc, leases.LeaseLost):
            self.failures.pop(agent_id, None)
            log.warning("agent %s: %s", agent_id, exc)
            return
        count = self.failures.get(agent_id, (0, 0.0))[0] + 1
        delay = min(BACKOFF_MAX_S, 2 ** (count - 1))
        self.failures[agent_id] = (count, time.monotonic() + delay)
        log.warning("driver of agent %s failed (%s: %s); again in %.0f s", agent_id,
                    type(exc).__name__, exc, delay, exc_info=exc if count == 1 else None)


@database_sync_to_async
def _agents_with_work() -> list[str]:
    pending = set(Command.objects.filter(state=CommandState.PENDING, agent__isnull=False)
                  .values_list("agent_id", flat=True).distinct())
    live = set(_live().values_list("id", flat=True))
    return sorted(pending | live)


def _live():
    """Agents whose sandbox should be running: not ended, not unloaded (idle
    unload stopped those on purpose; a command brings them back)."""
    return (Agent.objects.exclude(sandbox_id="")
            .exclude(status__in=ENDED)
            .exclude(status="idle", status_reason=UNLOADED))


_workspaces_waiting = database_sync_to_async(slots.workspaces_waiting)


@database_sync_to_async
def _live_agents() -> list[tuple[str, str]]:
    return list(_live().values_list("id", "sandbox_id", "sandbox_host"))


def current() -> Supervisor | None:
    return _current


def start(loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task:
    """Start this process's supervisor (once); returns its task."""
    global _current
    if _current is not None and _current.task is not None and not _current.task.done():
        return _current.task
    _current = Supervisor()
    return _current.start(loop)


def kick() -> None:
    """A command is pending: scan now (starts the supervisor in a worker
    process that did not start one, e.g. `manage.py runworker`)."""
    if _current is None or _current.task is None or _current.task.done():
        start()
    else:
        _current.kick()
