"""The agent driver: one asyncio task per active agent (sessions/worker/
supervisor.py keeps at most one per agent per process).

A driver (1) ensures the agent's sandbox — creates one with the backend when
the agent has none (sandboxes/launch.py; after its held credentials are
approved and in a free sandbox slot of its workspace, sessions/worker/
slots.py), or climbs the restore ladder
(sessions/worker/ladder.py) to the one it has; (2) holds a :class:`BridgeLink`
to its bridge; (3) runs a :class:`Relay` that journals the bridge's events
exactly once; (4) acts on the agent's pending Command rows in id order;
(5) takes turn checkpoints when the spec asks for them.

Commands (the Command row is the truth; wake-ups only hurry things along):

- ``spawn``: the sandbox is made; done.
- ``prompt``: bridge ``prompt {text, command_id: str(command id)}``. The bridge
  dedups by command_id, so a crash between sending and marking done is safe.
  While the agent is paused, prompts stay pending.
- ``steer``: bridge ``steer``. With no running turn (``no_turn``) the command
  is marked **failed** and a ``command.failed {command, verb, code, reason}``
  fact says why: a steer is never silently turned into a prompt.
- ``interrupt``: bridge ``abort`` (the turn settles as ``turn.interrupted``).
- ``pause`` / ``resume``: the bridge holds at the next step boundary (and
  starts no queued prompt) until resumed; the newest done pause/resume row
  decides, so it survives a restart.
- ``stop``: abort, let the relay drain, bridge ``shutdown``, remove the
  sandbox and its run dir, then ``agent.status stopped``.
- ``reattach``, ``rebridge``, ``checkpoint``, ``home_snapshot``:
  sessions/worker/operations.py (a look at the live home is refused, never
  acted on, while the sandbox is not running: sessions/worker/looks.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time

from channels.db import database_sync_to_async
from django.conf import settings

from sandboxes import launch
from sandboxes.backends import backend_for, get_backend
from sandboxes.backends.base import SandboxStatus
from sandboxes.bridge.protocol import BridgeState
from sandboxes.bridge_client import BridgeError, BridgeRequestError, BridgeUnavailable
from sessions import approvals, leases, live_home
from sessions.gateway.hub import open_listener
from sessions.models import ENDED, UNLOADED, CommandState

from . import checkpoints, ladder, looks, operations, slots, store
from .context import (
    AgentInfo,
    AgentLost,
    AwaitingApproval,
    BridgeRestarted,
    DriverError,
    PendingCommand,
    SandboxGone,
)
from .link import BridgeLink
from .relay import Relay

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 15
SAFETY_POLL_S = 5
#: A bridge lost again this soon after a recovery is a quick loss: the next
#: recovery waits 0.1 s, 0.2 s … up to RECOVER_BACKOFF_MAX_S, so a bridge that
#: answers and drops at once never makes the ladder a busy loop.
QUICK_LOSS_S = 2.0
RECOVER_BACKOFF_MAX_S = 5.0


class IdleClock:
    """When an agent has been quiet (no new bridge event) for ALINEO_IDLE_UNLOAD_S,
    or for ALINEO_MAKE_ROOM_S while another agent of its workspace waits for a
    sandbox slot (``make_room``: its idle sandbox is the slot that one needs)."""

    def __init__(self, cursor: int):
        self.cursor, self.since = cursor, time.monotonic()

    def due(self, cursor: int, make_room: bool = False) -> bool:
        if cursor != self.cursor:
            self.cursor, self.since = cursor, time.monotonic()
        limit = settings.ALINEO_IDLE_UNLOAD_S
        if make_room:
            room = settings.ALINEO_MAKE_ROOM_S
            limit = min(limit, room) if limit else room
        return bool(limit) and time.monotonic() - self.since >= limit


class AgentDriver:
    def __init__(self, agent_id: str, boot: bool = False, lease: leases.Held | None = None):
        self.agent_id = agent_id
        self.boot = boot  # first drive since this process started: the reattach rung is news
        self.lease = lease  # None only when driven outside a supervisor (tests, tools)
        self.healthy = False
        self.served = False  # it reached a bridge and acted (not only waited, e.g. for an approval)
        self.check_sandbox = False
        self.recovered_at = float("-inf")
        self.quick_losses = 0
        self.make_room = False  # another agent of the workspace waits for a sandbox slot
        self.wake = asyncio.Event()
        self.backend = get_backend()
        self.info: AgentInfo | None = None
        self.link = BridgeLink(agent_id)
        self.relay: Relay | None = None
        self.paused = False
        self._verbs = {
            "prompt": self._prompt, "steer": self._steer, "interrupt": self._interrupt,
            "pause": self._pause, "resume": self._pause,
            # The new agent's own command: provisioning it (a fork's from its origin) was the act.
            "spawn": self._done, "fork": self._done,
        }

    def kick(self) -> None:
        self.wake.set()

    def room_wanted(self, wanted: bool) -> None:
        """The supervisor's scan: does another agent of this workspace wait for
        a sandbox slot? Then an idle sandbox is unloaded after ALINEO_MAKE_ROOM_S."""
        if wanted and not self.make_room:
            self.wake.set()
        self.make_room = wanted

    def sandbox_gone(self) -> None:
        """The supervisor's watcher saw the sandbox not running: re-check now."""
        self.check_sandbox = True
        self.wake.set()

    # --- the task ---------------------------------------------------------------------------
    async def run(self) -> None:
        if self.lease is not None:
            leases.bind(self.lease)  # this task's journal writes are fenced by the lease
        try:
            if not await self._reach_a_bridge():
                return
            while True:
                self.healthy = self.served = True
                try:
                    if await self._serve():
                        return
                except (BridgeUnavailable, SandboxGone, BridgeRestarted) as exc:
                    # The bridge or its sandbox went away while we drove it (or
                    # was restarted on request): climb the ladder again at once.
                    self.healthy = False
                    log.warning("agent %s: lost the bridge (%s); recovering", self.agent_id, exc)
                    await self.link.disconnect()
                    await self._back_off()
                    if not await self._reload() or self._ended():
                        return
                    await self._recover()
                    self.recovered_at = time.monotonic()
        except AgentLost:
            await self._reload()
            await self._act_without_sandbox()
        except AwaitingApproval as exc:
            # The sandbox is gone and its replacement waits for an approval: the
            # approval's wake-up (or the supervisor's scan) runs us again.
            log.info("agent %s: %s", self.agent_id, exc)
        finally:
            self.healthy = False
            await self.link.disconnect()

    async def _back_off(self) -> None:
        if time.monotonic() - self.recovered_at >= QUICK_LOSS_S:
            self.quick_losses = 0
            return
        self.quick_losses += 1
        delay = min(RECOVER_BACKOFF_MAX_S, 0.1 * 2 ** (self.quick_losses - 1))
        log.warning("agent %s: the bridge was lost again %.1f s after a recovery (%d in a row); "
                    "waiting %.1f s", self.agent_id, time.monotonic() - self.recovered_at,
                    self.quick_losses, delay)
        await asyncio.sleep(delay)

    async def _reach_a_bridge(self) -> bool:
        """A connected bridge for the agent (False: nothing to drive now)."""
        if not await self._reload():
            return False
        # A look at the live home never wakes a sandbox: refused when it is
        # not running, and an unloaded agent with nothing else to do stays so.
        if (await looks.refuse_unless_running(self.info, await store.pending(self.agent_id))
                and live_home.stopped_on_purpose(self.info.status, self.info.status_reason)
                and not await store.pending(self.agent_id)):
            return False
        if not self._ended():
            # A sandbox that idle unload stopped comes back only into a free
            # slot (sessions/worker/slots.py); a running or lost one keeps its own.
            if not self.info.sandbox_slot and not await _slot(self.agent_id):
                return False
            await self._recover(boot=self.boot)
            return True
        if not await self._act_without_sandbox():
            return False
        # Held credentials: no sandbox (and no secret) before an operator
        # approved them; approval_requested is journaled and we wait.
        if not await _approved(self.agent_id, approvals.FIRST_START):
            denied = await _denial(self.agent_id)
            if denied:  # an operator refused: it cannot start (run() settles its commands)
                await ladder.lose(self.info, denied)
            return False
        # Then a free sandbox slot of the workspace, or the status says it waits.
        if not await _slot(self.agent_id):
            return False
        origin = await store.fork_origin(self.agent_id)
        if origin is not None:
            self._apply(await ladder.provision_fork(self.info, self.backend, origin))
        else:
            await self._provision()
        if not await self.link.connect(CONNECT_RETRY_S):
            raise DriverError(f"agent {self.agent_id}: the new bridge does not answer")
        return True

    async def _reload(self) -> bool:
        self.info = await store.load(self.agent_id)
        if self.info is not None and self.info.sandbox_id:
            # Drive the engine that holds the sandbox (recorded when it was
            # made), which may be another worker's DOCKER_HOST.
            self.backend = backend_for(self.info.sandbox_host)
        return self.info is not None

    def _ended(self) -> bool:
        """No sandbox to drive: the agent ended, or never had one."""
        return self.info.status in ENDED or not self.info.sandbox_id

    async def _recover(self, boot: bool = False) -> None:
        takeover = self.lease is not None and self.lease.expired
        self._apply(await ladder.recover(self.info, self.backend, self.link, boot=boot,
                                         takeover=takeover))

    def _apply(self, recovered: ladder.Recovered) -> None:
        self.backend = recovered.backend
        self.info.sandbox_id = recovered.sandbox_id
        self.info.cursor, self.info.session = recovered.cursor, recovered.session

    async def _serve(self) -> bool:
        """Relay and act on commands until stopped (True); raises when the
        bridge or the sandbox is lost."""
        info = self.info
        # The agent's model gateway (docs/GATEWAY.md), on its run dir's socket.
        gateway = await open_listener(self.agent_id, info.spec.get("model"),
                                      launch.run_dir_for(self.agent_id),
                                      info.secrets, self.lease)
        self.relay = Relay(self.agent_id, self.link, info.cursor, info.session,
                           secrets=info.secrets, after_turn=self._after_turn)
        relay_task = asyncio.create_task(self.relay.run(), name=f"relay-{self.agent_id}")
        try:
            if self.link.status is not None and self.link.status.pending_requests:
                await self.relay.answer_pending(self.link.status.pending_requests)
            idle = IdleClock(self.relay.cursor)
            while True:
                self.wake.clear()
                if await self._act_on_commands(relay_task):
                    return True
                if (idle.due(self.relay.cursor, self.make_room)
                        and await self._unload_if_idle(relay_task)):
                    return True
                await self._wait(relay_task)
        finally:
            if not relay_task.done():
                relay_task.cancel()
            await asyncio.gather(relay_task, return_exceptions=True)
            if gateway is not None:
                await gateway.close()

    async def _wait(self, relay_task: asyncio.Task) -> None:
        """Until a wake-up, the relay's end or the safety poll; raises when the
        relay ended or the watcher saw the sandbox go."""
        waiter = asyncio.create_task(self.wake.wait())
        await asyncio.wait({waiter, relay_task}, timeout=SAFETY_POLL_S,
                           return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if relay_task.done():
            relay_task.result()  # raises what ended it
            raise DriverError("the relay ended")
        if self.check_sandbox:
            self.check_sandbox = False
            state = await asyncio.to_thread(self.backend.status, self.info.sandbox_id)
            if state in (SandboxStatus.MISSING, SandboxStatus.EXITED):
                raise SandboxGone(f"sandbox {self.info.sandbox_id} is {state}")

    async def _after_turn(self, turn: int, seq: int) -> None:
        await checkpoints.after_turn(self.info, self.backend, turn, seq)

    async def _unload_if_idle(self, relay_task) -> bool:
        """Idle unload: no turn, nothing queued or pending for ALINEO_IDLE_UNLOAD_S
        (sooner while another agent waits for a sandbox slot). The bridge saves
        and exits and the sandbox is stopped; only then are `agent.unloaded`
        and the freed slot committed, together, so the slot goes to another
        agent only once this sandbox no longer runs (sessions/worker/slots.py).
        Meanwhile the watcher may see the stopped sandbox: it only flags this
        driver, which ends here. A crash before the commit leaves a live agent
        with a stopped sandbox, which the ladder restarts. This driver ends and
        its memory goes. A prompt brings it back (rung restart/resume, the
        bridge on its session: `session_start` fires with source "resume")."""
        status = await self.link.control.status()
        if (status.state is not BridgeState.IDLE or status.queued or status.paused
                or status.pending_requests or await store.pending(self.agent_id)
                or self.relay.cursor < status.head):
            return False
        info = self.info
        try:
            await self.link.control.shutdown()
        except BridgeError as exc:
            log.info("agent %s: bridge shutdown at unload: %s", info.id, exc)
        relay_task.cancel()
        await asyncio.to_thread(self.backend.stop, info.sandbox_id)
        await store.unloaded(info.id, [
            ("agent.unloaded", {"sandbox_id": info.sandbox_id,
                                "idle_s": settings.ALINEO_IDLE_UNLOAD_S}),
            ("agent.status", {"status": "idle", "reason": UNLOADED})])
        log.info("agent %s: unloaded after %ss idle (sandbox %s stopped)", info.id,
                 settings.ALINEO_IDLE_UNLOAD_S, info.sandbox_id[:16])
        return True

    # --- the sandbox ---------------------------------------------------------------------------
    async def _act_without_sandbox(self) -> bool:
        """An agent with no sandbox: True when a pending command needs one."""
        info = self.info
        pending = await store.pending(self.agent_id)
        if not pending:
            return False
        if info.status in ENDED:
            for cmd in pending:
                if cmd.verb == "stop":
                    await store.settle_async(self.agent_id, cmd, CommandState.DONE)
                else:
                    await store.settle_async(self.agent_id, cmd, CommandState.FAILED, failure=(
                        "agent_ended", f"the agent is {info.status}"))
            return False
        return True

    async def _provision(self) -> None:
        info = self.info
        sid = await asyncio.to_thread(launch.create_sandbox, self.backend, info.launch)
        await store.sandbox_started(info.id, sid, self.backend.name, self.backend.host)
        info.sandbox_id = sid
        log.info("agent %s: sandbox %s started (%s)", info.id, sid, self.backend.name)

    # --- commands --------------------------------------------------------------------------------
    async def _act_on_commands(self, relay_task) -> bool:
        """Act on pending commands in id order; True once the agent is stopped."""
        self.paused = await store.paused(self.agent_id)
        for cmd in await store.pending(self.agent_id):
            # Looked at after the rows were read, so a hold made before a
            # command was journaled always holds it.
            if held_by_test(self.agent_id):
                return False  # they stay pending; the next wake-up or safety poll looks again
            if cmd.verb == "stop":
                await self._stop(cmd, relay_task)
                return True
            if cmd.verb in operations.VERBS:
                if await operations.act(cmd, self.info, self.backend, self.link) \
                        is operations.Acted.RESTARTED:
                    raise BridgeRestarted(f"the bridge of {self.agent_id} was restarted "
                                          f"(command {cmd.id})")
                continue
            verb = self._verbs.get(cmd.verb)
            if verb is None:
                await self._settle(cmd, CommandState.FAILED,
                                   ("unknown_verb", f"cannot act on {cmd.verb!r}"))
            else:
                await verb(cmd)
        return False

    async def _settle(self, cmd: PendingCommand, state: str, failure=None, final=None) -> None:
        await store.settle_async(self.agent_id, cmd, state, failure=failure, final=final)

    async def _done(self, cmd: PendingCommand) -> None:
        await self._settle(cmd, CommandState.DONE)

    async def _prompt(self, cmd: PendingCommand) -> None:
        if self.paused:
            return  # prompts wait while the agent is paused
        await self.link.control.prompt(cmd.text, command_id=str(cmd.id))
        await self._done(cmd)

    async def _steer(self, cmd: PendingCommand) -> None:
        try:
            await self.link.control.steer(cmd.text, command_id=str(cmd.id))
        except BridgeRequestError as exc:
            if exc.code != "no_turn":
                raise
            await self._settle(cmd, CommandState.FAILED, (
                "no_turn", "no turn was running to steer; send a prompt instead"))
            return
        await self._done(cmd)

    async def _interrupt(self, cmd: PendingCommand) -> None:
        await self.link.control.abort()
        await self._done(cmd)

    async def _pause(self, cmd: PendingCommand) -> None:
        # The bridge lets the step in flight finish, then holds at the next
        # step boundary (and starts no queued prompt) until resumed.
        self.paused = cmd.verb == "pause"
        await (self.link.control.pause() if self.paused else self.link.control.unpause())
        await self._done(cmd)

    async def _stop(self, cmd: PendingCommand, relay_task) -> None:
        info = self.info
        try:
            await self.link.control.abort()
            head = (await self.link.control.status()).head
            deadline = time.monotonic() + 10
            while self.relay.cursor < head and not relay_task.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await self.link.control.shutdown()
        except BridgeError as exc:
            log.info("agent %s: bridge did not shut down cleanly: %s", info.id, exc)
        relay_task.cancel()
        await asyncio.gather(relay_task, return_exceptions=True)
        await asyncio.to_thread(self.backend.remove, info.sandbox_id)
        await asyncio.to_thread(shutil.rmtree, launch.run_dir_for(info.id), True)
        await self._settle(cmd, CommandState.DONE, final=("agent.status", {
            "status": "stopped", "reason": "sandbox removed", "command": cmd.id,
            "sandbox_id": info.sandbox_id}))
        log.info("agent %s: stopped, sandbox %s removed", info.id, info.sandbox_id)


def held_by_test(agent_id: str) -> bool:
    """The fault tests' hold (settings.ALINEO_TEST_HOLD_DIR): while a file named
    after the agent is there, its commands stay journaled and undelivered."""
    hold = settings.ALINEO_TEST_HOLD_DIR
    return bool(hold) and os.path.exists(os.path.join(hold, agent_id))


_approved = database_sync_to_async(approvals.ensure_approved)
_denial = database_sync_to_async(approvals.denial)
_slot = database_sync_to_async(slots.claim)
