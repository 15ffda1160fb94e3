"""The agent driver: one asyncio task per active agent (sandboxes.supervisor
keeps at most one per agent per process).

A driver (1) ensures the agent's sandbox — creates one with the backend when
the agent has none (run dir ``DATA_DIR/run/<agent>`` holding a copy of
``sandboxes/bridge`` and ``config.json``), or starts an Exited one; (2)
connects to the bridge (two connections: one long-polls events, one carries
everything else); (3) runs a :class:`sandboxes.relay.Relay` that journals the
bridge's events exactly once; (4) acts on the agent's pending Command rows in
id order; (5) takes turn checkpoints when the spec asks for them.

Commands (the Command row is the truth; wake-ups only hurry things along):

- ``spawn``: the sandbox is made; done.
- ``prompt``: bridge ``prompt {text, command_id: str(command id)}``. The bridge
  dedups by command_id, so a crash between sending and marking done is safe.
  While the agent is paused, prompts stay pending.
- ``steer``: bridge ``steer``. With no running turn (``no_turn``) the command
  is marked **failed** and a ``command.failed {command, verb, code, reason}``
  fact says why: a steer is never silently turned into a prompt.
- ``interrupt``: bridge ``abort`` (the turn settles as ``turn.interrupted``).
- ``pause`` / ``resume``: done at once; pause holds queued prompts back (the
  newest done pause/resume row decides, so it survives a restart).
- ``stop``: abort, let the relay drain, bridge ``shutdown``, remove the
  sandbox and its run dir, then ``agent.status stopped``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sandboxes.backends.base import (
    SandboxStatus,
    backend_for,
    get_backend,
)
from sandboxes.bridge_client import BridgeClient, BridgeError, BridgeRequestError, BridgeUnavailable
from sandboxes.checkpoints import rotate_checkpoints, store_checkpoint
from sandboxes import operations
from sandboxes.provisioning import (  # noqa: F401 - part of the driver's interface
    BRIDGE_SRC,
    DriverError,
    _create_sandbox,
    extra_labels,
    harness_revision,
    profile_revision,
    run_dir_for,
)
from sandboxes.relay import Relay
from sessions import approvals, credentials, leases

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 15
SAFETY_POLL_S = 5
ENDED = ("stopped", "lost", "unrecoverable")
KEEP_CHECKPOINTS = 3


UNLOADED = "unloaded"  # the status reason of an agent whose sandbox idle unload stopped


class IdleClock:
    """When an agent has been quiet (no new bridge event) for ALINEO_IDLE_UNLOAD_S."""

    def __init__(self, cursor: int):
        self.cursor, self.since = cursor, time.monotonic()

    def due(self, cursor: int) -> bool:
        if cursor != self.cursor:
            self.cursor, self.since = cursor, time.monotonic()
        limit = settings.ALINEO_IDLE_UNLOAD_S
        return bool(limit) and time.monotonic() - self.since >= limit


class SandboxGone(Exception):
    """The sandbox of a driven agent is not running any more."""


@dataclass
class AgentInfo:
    id: str
    spec: dict
    status: str
    sandbox_id: str
    cursor: int
    session: str
    zero_retention: bool
    max_age_days: int
    keep: int
    secrets: list = None  # sessions.credentials.Secret: bound values, for the env and redaction
    sandbox_host: str = ""  # the engine that holds sandbox_id (backends.base.backend_for)


class AgentDriver:
    def __init__(self, agent_id: str, boot: bool = False, lease: leases.Held | None = None):
        self.agent_id = agent_id
        self.boot = boot  # first drive since this process started: the reattach rung is news
        self.lease = lease  # None only when driven outside a supervisor (tests, tools)
        self.healthy = False
        self.served = False  # it reached a bridge and acted (not only waited, e.g. for an approval)
        self.check_sandbox = False
        self.status: dict | None = None
        self.wake = asyncio.Event()
        self.backend = get_backend()
        self.info: AgentInfo | None = None
        self.control: BridgeClient | None = None
        self.events: BridgeClient | None = None
        self.relay: Relay | None = None

    def kick(self) -> None:
        self.wake.set()

    def _reach(self, info: AgentInfo) -> None:
        """Drive the engine that holds the agent's sandbox (recorded when it
        was made), which may be another worker's DOCKER_HOST."""
        if info.sandbox_id:
            self.backend = backend_for(info.sandbox_host)

    # --- the task ---------------------------------------------------------------------------
    async def run(self) -> None:
        from sandboxes import ladder

        if self.lease is not None:
            leases.bind(self.lease)  # this task's journal writes are fenced by the lease
        try:
            self.info = info = await _load(self.agent_id)
            if info is None:
                return
            self._reach(info)
            if info.status in ENDED or not info.sandbox_id:
                if not await self._act_without_sandbox():
                    return
                # Held credentials: no sandbox (and no secret) before an operator
                # approved them; approval_requested is journaled and we wait.
                if not await _approved(info.id, approvals.FIRST_START):
                    return
                origin = await _fork_origin(info.id)
                if origin is not None:
                    await ladder.provision_fork(self, origin)
                else:
                    await self._provision()
                if not await self.connect(CONNECT_RETRY_S):
                    raise DriverError(f"agent {info.id}: the new bridge does not answer")
            else:
                await ladder.recover(self, boot=self.boot)
            while True:
                self.healthy = self.served = True
                try:
                    if await self._serve():
                        return
                except (BridgeUnavailable, SandboxGone) as exc:
                    # The bridge or its sandbox went away while we drove it:
                    # climb the ladder again at once (no backoff, no prompt needed).
                    self.healthy = False
                    log.warning("agent %s: lost the bridge (%s); recovering", self.agent_id, exc)
                    await self.disconnect()
                    self.info = info = await _load(self.agent_id)
                    if info is None or info.status in ENDED or not info.sandbox_id:
                        return
                    self._reach(info)
                    await ladder.recover(self)
        except ladder.AgentLost:
            self.info = await _load(self.agent_id)
            await self._act_without_sandbox()
        except approvals.AwaitingApproval as exc:
            # The sandbox is gone and its replacement waits for an approval: the
            # approval's wake-up (or the supervisor's scan) runs us again.
            log.info("agent %s: %s", self.agent_id, exc)
        finally:
            self.healthy = False
            await self.disconnect()

    async def connect(self, retry_for: float) -> bool:
        """Connect both clients to the sandbox's bridge and check that it
        answers ``status`` (within ``retry_for`` s); False when it does not."""
        await self.disconnect()
        sock = str(run_dir_for(self.agent_id) / "bridge.sock")
        try:
            self.control = await BridgeClient.connect(sock, retry_for=retry_for)
            self.events = await BridgeClient.connect(sock, retry_for=retry_for)
            self.status = await self.control.request("status", timeout=max(retry_for, 5))
        except BridgeUnavailable as exc:
            log.info("agent %s: the bridge does not answer: %s", self.agent_id, exc)
            await self.disconnect()
            return False
        return True

    async def disconnect(self) -> None:
        for client in (self.control, self.events):
            if client is not None:
                await client.close()
        self.control = self.events = None

    def sandbox_gone(self) -> None:
        """The supervisor's watcher saw the sandbox not running: re-check now."""
        self.check_sandbox = True
        self.wake.set()

    async def _serve(self) -> bool:
        """Relay and act on commands until stopped (True); raises when the
        bridge or the sandbox is lost."""
        info = self.info
        self.relay = Relay(self, self.events, info.cursor, info.session)
        relay_task = asyncio.create_task(self.relay.run(), name=f"relay-{self.agent_id}")
        try:
            if (self.status or {}).get("pending_requests"):
                await self.relay.answer_pending(self.status["pending_requests"])
            idle = IdleClock(self.relay.cursor)
            while True:
                self.wake.clear()
                if await self._act_on_commands(relay_task):
                    return True
                if idle.due(self.relay.cursor) and await self._unload_if_idle(relay_task):
                    return True
                waiter = asyncio.create_task(self.wake.wait())
                await asyncio.wait({waiter, relay_task}, timeout=SAFETY_POLL_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if relay_task.done():
                    relay_task.result()  # raises what ended it
                    raise DriverError("the relay ended")
                if self.check_sandbox:
                    self.check_sandbox = False
                    state = await asyncio.to_thread(self.backend.status, info.sandbox_id)
                    if state in (SandboxStatus.MISSING, SandboxStatus.EXITED):
                        raise SandboxGone(f"sandbox {info.sandbox_id} is {state}")
        finally:
            if not relay_task.done():
                relay_task.cancel()
            await asyncio.gather(relay_task, return_exceptions=True)

    async def _unload_if_idle(self, relay_task) -> bool:
        """Idle unload: no turn, nothing queued or pending for ALINEO_IDLE_UNLOAD_S.
        Journaled first (so the watcher leaves the stopped sandbox alone), then
        the bridge saves and exits and the sandbox is stopped; this driver ends
        and its memory goes. A prompt brings it back (rung restart/resume, the
        bridge on its session: `session_start` fires with source "resume")."""
        status = await self.control.request("status")
        if (status.get("state") != "idle" or status.get("queued") or status.get("paused")
                or status.get("pending_requests") or await _pending(self.agent_id)
                or self.relay.cursor < int(status.get("head") or 0)):
            return False
        info = self.info
        await _journal(info.id, [
            ("agent.unloaded", {"sandbox_id": info.sandbox_id,
                                "idle_s": settings.ALINEO_IDLE_UNLOAD_S}),
            ("agent.status", {"status": "idle", "reason": UNLOADED})])
        try:
            await self.control.request("shutdown")
        except BridgeError as exc:
            log.info("agent %s: bridge shutdown at unload: %s", info.id, exc)
        relay_task.cancel()
        await asyncio.to_thread(self.backend.stop, info.sandbox_id)
        log.info("agent %s: unloaded after %ss idle (sandbox %s stopped)", info.id,
                 settings.ALINEO_IDLE_UNLOAD_S, info.sandbox_id[:16])
        return True

    # --- the sandbox ---------------------------------------------------------------------------
    async def _act_without_sandbox(self) -> bool:
        """An agent with no sandbox: True when a pending command needs one."""
        info = self.info
        pending = await _pending(self.agent_id)
        if not pending:
            return False
        if info.status in ENDED:
            for cmd in pending:
                ok = cmd.verb == "stop"
                await _mark(self.agent_id, cmd, "done" if ok else "failed",
                            None if ok else ("agent_ended", f"the agent is {info.status}"))
            return False
        return True

    async def _provision(self) -> None:
        info = self.info
        run = run_dir_for(info.id)
        sid = await asyncio.to_thread(_create_sandbox, self.backend, info, run)
        await _sandbox_started(info.id, sid, self.backend.name, self.backend.host)
        info.sandbox_id = sid
        log.info("agent %s: sandbox %s started (%s)", info.id, sid, self.backend.name)

    # --- commands --------------------------------------------------------------------------------
    async def _act_on_commands(self, relay_task) -> bool:
        """Act on pending commands in id order; True once the agent is stopped."""
        paused = await _paused(self.agent_id)
        for cmd in await _pending(self.agent_id):
            verb = cmd.verb
            if verb == "prompt":
                if paused:
                    continue
                await self.control.request("prompt", text=cmd.text, command_id=str(cmd.id))
                await _mark(self.agent_id, cmd, "done")
            elif verb == "steer":
                try:
                    await self.control.request("steer", text=cmd.text, command_id=str(cmd.id))
                except BridgeRequestError as exc:
                    if exc.code != "no_turn":
                        raise
                    await _mark(self.agent_id, cmd, "failed",
                                ("no_turn", "no turn was running to steer; send a prompt instead"))
                    continue
                await _mark(self.agent_id, cmd, "done")
            elif verb == "interrupt":
                await self.control.request("abort")
                await _mark(self.agent_id, cmd, "done")
            elif verb in ("pause", "resume"):
                # The bridge lets the step in flight finish, then holds at the
                # next step boundary (and starts no queued prompt) until resumed.
                paused = verb == "pause"
                await self.control.request("pause" if paused else "unpause")
                await _mark(self.agent_id, cmd, "done")
            elif verb == "spawn":  # the sandbox exists now: nothing more to do
                await _mark(self.agent_id, cmd, "done")
            elif verb == "stop":
                await self._stop(cmd, relay_task)
                return True
            elif verb in operations.VERBS:  # reattach, rebridge, checkpoint: sandboxes/operations.py
                await operations.act(self, cmd)
            else:
                await _mark(self.agent_id, cmd, "failed", ("unknown_verb", f"cannot act on {verb!r}"))
        return False

    async def _stop(self, cmd, relay_task) -> None:
        info = self.info
        try:
            await self.control.request("abort")
            head = int((await self.control.request("status")).get("head") or 0)
            deadline = time.monotonic() + 10
            while self.relay.cursor < head and not relay_task.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await self.control.request("shutdown")
        except BridgeError as exc:
            log.info("agent %s: bridge did not shut down cleanly: %s", info.id, exc)
        relay_task.cancel()
        await asyncio.gather(relay_task, return_exceptions=True)
        await asyncio.to_thread(self.backend.remove, info.sandbox_id)
        await asyncio.to_thread(shutil.rmtree, run_dir_for(info.id), True)
        await _mark(self.agent_id, cmd, "done", final=("agent.status", {
            "status": "stopped", "reason": "sandbox removed", "command": cmd.id,
            "sandbox_id": info.sandbox_id}))
        log.info("agent %s: stopped, sandbox %s removed", info.id, info.sandbox_id)

    # --- turn checkpoints ---------------------------------------------------------------------------
    async def take_checkpoint(self, turn: int, through_seq: int) -> None:
        info = self.info
        if not info.spec.get("checkpoint") or info.zero_retention:
            return
        try:
            stored = await asyncio.to_thread(store_checkpoint, self.backend, info.sandbox_id, info.id, turn)
            await _record_checkpoint(info, turn, through_seq, stored)
        except Exception as exc:  # noqa: BLE001 - a missed checkpoint, not a failed turn
            log.warning("agent %s: checkpoint of turn %s failed: %s", info.id, turn, exc)
            await _journal(info.id, [("agent.checkpoint_failed",
                                      {"turn": turn, "reason": f"{type(exc).__name__}: {exc}"[:1000]})])


# --- database helpers ---------------------------------------------------------------------------


@dataclass
class PendingCommand:
    id: int
    verb: str
    text: str | None


@database_sync_to_async
def _load(agent_id: str) -> AgentInfo | None:
    from sessions.models import Agent

    a = Agent.objects.select_related("workspace").filter(pk=agent_id).first()
    if a is None:
        return None
    ws = a.workspace
    spec = dict(a.spec or {})
    return AgentInfo(a.id, spec, a.status, a.sandbox_id, a.bridge_cursor,
                     a.bridge_session, ws.zero_data_retention, ws.checkpoint_max_age_days,
                     ws.keep_newest_checkpoints or KEEP_CHECKPOINTS,
                     credentials.secrets_for(ws.id, spec.get("credentials") or []),
                     a.sandbox_host)


@database_sync_to_async
def _pending(agent_id: str) -> list[PendingCommand]:
    from sessions.models import Command, Event

    rows = list(Command.objects.filter(agent_id=agent_id, state="pending").order_by("id")
                .values_list("id", "verb", "seq"))
    seqs = [seq for _, verb, seq in rows if verb in ("prompt", "steer") and seq]
    texts = dict(Event.objects.filter(agent_id=agent_id, seq__in=seqs).values_list("seq", "data"))
    return [PendingCommand(cid, verb, (texts.get(seq) or {}).get("text")) for cid, verb, seq in rows]


@database_sync_to_async
def _paused(agent_id: str) -> bool:
    from sessions.models import Command

    last = (Command.objects.filter(agent_id=agent_id, state="done", verb__in=("pause", "resume"))
            .order_by("-id").values_list("verb", flat=True).first())
    return last == "pause"


@database_sync_to_async
def _mark(agent_id: str, cmd: PendingCommand, state: str, failure=None, final=None) -> None:
    from sessions import journal
    from sessions.models import Command

    with transaction.atomic():
        Command.objects.filter(pk=cmd.id, state="pending").update(state=state, acted_at=timezone.now())
        facts = []
        if failure is not None:
            code, reason = failure
            facts.append(("command.failed", {"command": cmd.id, "verb": cmd.verb,
                                             "code": code, "reason": reason}))
        if final is not None:
            facts.append(final)
        if facts:
            journal.append_many(agent_id, facts)


@database_sync_to_async
def _sandbox_started(agent_id: str, sandbox_id: str, backend: str, host: str) -> None:
    """Record the new sandbox; the agent becomes idle only if it was starting:
    a pause sent while the sandbox was being made must hold."""
    from sessions import journal
    from sessions.models import Agent

    with transaction.atomic():
        status = Agent.objects.filter(pk=agent_id).values_list("status", flat=True).first()
        facts = [("agent.sandbox", {"sandbox_id": sandbox_id, "backend": backend, "host": host})]
        if status == "starting":
            facts.append(("agent.status", {"status": "idle", "reason": "sandbox started"}))
        journal.append_many(agent_id, facts)


_approved = database_sync_to_async(approvals.ensure_approved)


@database_sync_to_async
def _fork_origin(agent_id: str) -> dict | None:
    """Where a forked agent starts from (its `agent.spawned` fact), or None."""
    from sessions.models import Event

    data = (Event.objects.filter(agent_id=agent_id, type="agent.spawned").order_by("seq")
            .values_list("data", flat=True).first())
    return (data or {}).get("fork") or None


@database_sync_to_async
def _journal(agent_id: str, facts) -> None:
    from sessions import journal

    journal.append_many(agent_id, facts)


@database_sync_to_async
def _record_checkpoint(info: AgentInfo, turn: int, through_seq: int, stored) -> None:
    """The Checkpoint row and its `agent.checkpointed` fact in one transaction,
    then rotation to the workspace's newest-N for this sandbox."""
    from sessions import journal
    from sessions.models import Checkpoint

    now = timezone.now()
    with transaction.atomic():
        row = Checkpoint.objects.create(
            agent_id=info.id, sandbox_id=info.sandbox_id, turn=turn, through_seq=through_seq,
            path=str(stored.path), bytes=stored.bytes, duration_ms=stored.ms,
            harness_revision=harness_revision(), profile_revision=profile_revision(info.spec),
            expires_at=now + timedelta(days=info.max_age_days))
        journal.append(info.id, "agent.checkpointed",
                       {"checkpoint": row.pk, "turn": turn, "bytes": stored.bytes, "ms": stored.ms})
    rotate_checkpoints(info.id, info.sandbox_id, keep=info.keep)
