"""The supervisor: one per process, on the serving loop; it keeps one
:class:`sandboxes.driver.AgentDriver` task per agent that has work.

An agent has work when it has pending Command rows, or when it has a sandbox
and has not ended (its bridge may be running turns or holding unjournaled
events). **Boot recovery**: the first scan starts a driver for every such
agent, and a driver's first act is :func:`sandboxes.ladder.recover` — reattach
(journaled as ``agent.restored {rung: reattach, reason:
control_plane_restart}``), resume, restart, restore, rebuild or lost — before
it acts on any command. The **watcher** (every ``WATCH_S``) lists the
backend's sandboxes once and sends the ladder to agents whose sandbox is not
running, without waiting for a prompt or a driver's backoff. The scan runs at start, on every
wake-up (``kick()``, from the worker consumer on ``command.pending``) and every
``SCAN_S`` seconds as a safety net, because wake-ups are best effort. A driver
that fails is started again after a backoff (1 s doubling to 60 s).

Never two drivers for one agent in a process; across processes the cursor
guard in sandboxes.relay refuses a second writer (the per-agent lease for
scale-out is not built yet).
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

log = logging.getLogger(__name__)

SCAN_S = 3.0
WATCH_S = 3.0
BACKOFF_MAX_S = 60.0

_current: Supervisor | None = None


class Supervisor:
    def __init__(self):
        self.drivers: dict[str, asyncio.Task] = {}
        self.objects: dict[str, object] = {}
        self.failures: dict[str, tuple[int, float]] = {}  # agent → (count, not before)
        self.driven: set[str] = set()  # agents this process has driven (boot recovery is over for them)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.next_watch = 0.0
        self.next_sweep = 0.0  # the first scan sweeps: a policy changed while down applies at boot
        self.chores: asyncio.Task | None = None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task:
        loop = loop or asyncio.get_event_loop()
        self.task = loop.create_task(self._main(), name="supervisor")
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
        tasks = list(self.drivers.values()) + ([self.chores] if self.chores else [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def scan(self) -> None:
        now = time.monotonic()
        for agent_id in await _agents_with_work():
            driver = self.objects.get(agent_id)
            if agent_id in self.drivers and driver is not None:
                if getattr(driver, "healthy", False):
                    self.failures.pop(agent_id, None)  # it recovered: the backoff starts over
                driver.kick()
                continue
            _count, not_before = self.failures.get(agent_id, (0, 0.0))
            if now < not_before:
                continue
            self._start_driver(agent_id)
        if now >= self.next_watch:
            self.next_watch = now + WATCH_S
            await self.watch()
        if now >= self.next_sweep and (self.chores is None or self.chores.done()):
            self.next_sweep = now + settings.ALINEO_SWEEP_S
            # A task of its own: a long backup must not hold up new commands.
            self.chores = asyncio.get_running_loop().create_task(self.housekeeping(), name="housekeeping")

    async def housekeeping(self) -> None:
        """The retention sweep (and, when configured, a scheduled backup), off the loop."""
        from sandboxes.retention import sweep

        try:
            await database_sync_to_async(sweep)()
        except Exception:
            log.exception("retention sweep failed")
        if settings.ALINEO_BACKUP_DIR:
            from sessions.backup import run_scheduled_if_due

            await asyncio.to_thread(run_scheduled_if_due)  # never raises; logs a failure

    async def watch(self) -> None:
        """The watcher: agents that should be running whose sandbox is not
        (removed, exited) get their driver's ladder now — no prompt needed,
        no backoff wait."""
        from sandboxes.backends.base import SandboxStatus, get_backend

        live = await _live_agents()
        if not live:
            return
        backend = get_backend()
        try:
            handles = await asyncio.to_thread(backend.list)
        except Exception as exc:  # noqa: BLE001 - the engine may be down: nothing to tell now
            log.info("watcher: cannot list sandboxes: %s", exc)
            return
        states = {h.id: h.status for h in handles}
        for agent_id, sandbox_id in live:
            state = states.get(sandbox_id, SandboxStatus.MISSING)
            if state is SandboxStatus.RUNNING:
                continue
            driver = self.objects.get(agent_id)
            if agent_id in self.drivers and driver is not None:
                driver.sandbox_gone()
            else:
                log.info("watcher: agent %s has sandbox %s %s: recovering now", agent_id,
                         sandbox_id[:16], state)
                self.failures.pop(agent_id, None)
                self._start_driver(agent_id)

    def _start_driver(self, agent_id: str) -> None:
        from sandboxes.driver import AgentDriver

        driver = AgentDriver(agent_id, boot=agent_id not in self.driven)
        self.driven.add(agent_id)
        task = asyncio.get_running_loop().create_task(driver.run(), name=f"driver-{agent_id}")
        self.drivers[agent_id] = task
        self.objects[agent_id] = driver
        task.add_done_callback(lambda t, a=agent_id: self._ended(a, t))

    def _ended(self, agent_id: str, task: asyncio.Task) -> None:
        if self.drivers.get(agent_id) is task:
            del self.drivers[agent_id]
            self.objects.pop(agent_id, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self.failures.pop(agent_id, None)
            return
        count = self.failures.get(agent_id, (0, 0.0))[0] + 1
        delay = min(BACKOFF_MAX_S, 2 ** (count - 1))
        self.failures[agent_id] = (count, time.monotonic() + delay)
        log.warning("driver of agent %s failed (%s: %s); again in %.0f s", agent_id,
                    type(exc).__name__, exc, delay, exc_info=exc if count == 1 else None)


@database_sync_to_async
def _agents_with_work() -> list[str]:
    from sessions.models import Command

    pending = set(Command.objects.filter(state="pending", agent__isnull=False)
                  .values_list("agent_id", flat=True).distinct())
    live = set(_live().values_list("id", flat=True))
    return sorted(pending | live)


def _live():
    """Agents whose sandbox should be running: not ended, not unloaded (idle
    unload stopped those on purpose; a command brings them back)."""
    from sandboxes.driver import UNLOADED
    from sessions.models import Agent

    return (Agent.objects.exclude(sandbox_id="")
            .exclude(status__in=("stopped", "lost", "unrecoverable"))
            .exclude(status="idle", status_reason=UNLOADED))


@database_sync_to_async
def _live_agents() -> list[tuple[str, str]]:
    return list(_live().values_list("id", "sandbox_id"))


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
