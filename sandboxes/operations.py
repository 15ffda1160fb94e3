"""The client's operations on a live agent: what the worker does for the
``reattach``, ``rebridge`` and ``checkpoint`` commands (sessions.commands
OPERATION_VERBS), whose callers wait for an outcome.

The command is journaled first (``command.reattach`` …) like every other one;
the agent's driver acts on it from ``AgentDriver._act_on_commands`` and stores
what happened in ``Command.result``, which ``GET /api/commands/{id}`` shows:

- **reattach** touches nothing: the bridge must answer ``status`` within
  :data:`ANSWER_S` (4 s: the caller hears within 5 s). Done → ``{"sandbox_id",
  "rung", …}`` where ``rung`` is ``reattach``, or the rung the restore ladder
  took since the command was journaled (an idle-unloaded agent comes back
  through *restart*/*resume*, a removed sandbox through *restore*/*rebuild* —
  with the new sandbox id). A sandbox that is gone or stopped is not a
  failure: the result says ``{"phase": "recovering"}`` while the driver climbs
  the ladder, and the command is answered once the bridge answers. A running
  sandbox whose bridge does not answer in time is ``failed`` with
  ``runtime.bridge_unavailable`` (and the driver then recovers it as the
  ladder does).
- **rebridge** (the client's *resume*): the bridge is shut down and started
  again on its session file in the same sandbox; a running turn is settled as
  ``turn.interrupted`` by the bridge. Journaled as ``agent.restored {rung:
  "resume", reason: "client_resume", command}``. A rung that already started
  a fresh bridge since the command was journaled (resume, restart, restore,
  rebuild) counts: the bridge is not restarted twice.
- **checkpoint** takes a turn checkpoint of the home now (at any point of a
  turn) → ``{"checkpoint": id, "turn", "bytes", "ms"}``; a failure journals
  ``agent.checkpoint_failed`` (never a failed turn) and fails the command
  with ``runtime.checkpoint_failed``.

Progress is kept in ``Command.result`` (``phase``), so a worker that dies in
the middle picks the command up again without doing it twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from sandboxes.backends.base import SandboxStatus
from sandboxes.bridge_client import BridgeError, BridgeUnavailable
from sandboxes.errors import SandboxError, SandboxNotFound

if TYPE_CHECKING:  # pragma: no cover
    from sandboxes.driver import AgentDriver, PendingCommand

log = logging.getLogger(__name__)

VERBS = ("reattach", "rebridge", "checkpoint")
# BRIEF §3: reattach needs a bridge that answers within 5 s. The probe gets 4 s
# so that the caller — POST, wake-up, probe, poll — hears the answer within 5 s.
ANSWER_S = 4.0
RESTART_CONNECT_S = 15.0
# Rungs after which the bridge is a freshly started process on its session.
FRESH_BRIDGE = ("resume", "restart", "restore", "rebuild")


class BridgeRestarted(BridgeUnavailable):
    """The bridge was restarted on request: the driver reconnects (the
    ladder's silent reattach) and then answers the command."""


async def act(driver: AgentDriver, cmd: PendingCommand) -> None:
    """Act on one pending operation command of ``driver``'s agent."""
    seq, progress = await _row(cmd.id)
    if cmd.verb == "reattach":
        await _reattach(driver, cmd, seq)
    elif cmd.verb == "rebridge":
        await _rebridge(driver, cmd, seq, progress)
    elif cmd.verb == "checkpoint":
        await _checkpoint(driver, cmd)


# --- reattach ---------------------------------------------------------------------------


async def _reattach(driver: AgentDriver, cmd: PendingCommand, seq: int) -> None:
    from sandboxes.driver import SandboxGone

    info = driver.info
    try:
        status = await driver.control.request("status", timeout=ANSWER_S)
    except BridgeUnavailable as exc:
        state = await asyncio.to_thread(driver.backend.status, info.sandbox_id)
        if state in (SandboxStatus.MISSING, SandboxStatus.EXITED):
            await _progress(cmd.id, {"phase": "recovering", "sandbox_state": state.value})
            raise SandboxGone(f"sandbox {info.sandbox_id} is {state}") from exc
        await _settle(info.id, cmd, "failed", {
            "code": "runtime.bridge_unavailable", "sandbox_id": info.sandbox_id,
            "message": f"the bridge in sandbox {info.sandbox_id} did not answer within "
                       f"{ANSWER_S:g} s ({exc.message}); resume the agent to restart it"})
        raise
    restored = await _rung_since(info.id, seq)
    turn = status.get("turn") or {}
    await _settle(info.id, cmd, "done", {**_outcome(info, restored, "reattach"),
                                         "state": status.get("state"),
                                         "turn": turn.get("turn") if isinstance(turn, dict) else None})


# --- rebridge (the client's resume) ----------------------------------------------------------


async def _rebridge(driver: AgentDriver, cmd: PendingCommand, seq: int, progress: dict) -> None:
    from sandboxes.driver import SandboxGone

    info = driver.info
    restored = await _rung_since(info.id, seq)
    if progress.get("phase") == "restarted" or (restored and restored.get("rung") in FRESH_BRIDGE):
        await _settle(info.id, cmd, "done", _outcome(info, restored, "resume"))
        return
    sid = info.sandbox_id
    await _progress(cmd.id, {"phase": "restarting"})
    try:
        # A clean stop: the bridge settles a running turn (turn.interrupted)
        # and saves its session before it exits.
        await driver.control.request("shutdown", timeout=ANSWER_S)
    except BridgeError as exc:
        log.info("agent %s: bridge shutdown before resume: %s", info.id, exc)
    await driver.disconnect()
    try:
        await asyncio.to_thread(driver.backend.stop, sid, 10)
        await asyncio.to_thread(driver.backend.start, sid)
    except SandboxNotFound as exc:
        raise SandboxGone(f"sandbox {sid} is gone: {exc}") from exc
    except SandboxError as exc:
        if exc.permanent:
            raise SandboxGone(f"sandbox {sid} cannot start: {exc}") from exc
        raise
    await _restarted(info.id, cmd.id, sid)
    log.info("agent %s: bridge restarted in sandbox %s on request (command %s)", info.id,
             sid[:16], cmd.id)
    if not await driver.connect(RESTART_CONNECT_S):
        raise BridgeUnavailable(f"the bridge in sandbox {sid} did not answer after its restart")
    raise BridgeRestarted(f"the bridge in sandbox {sid} was restarted (command {cmd.id})")


# --- checkpoint --------------------------------------------------------------------------------


async def _checkpoint(driver: AgentDriver, cmd: PendingCommand) -> None:
    info = driver.info
    if not info.spec.get("checkpoint") or info.zero_retention:
        await _settle(info.id, cmd, "failed", {
            "code": "checkpoint.disabled",
            "message": "this agent takes no checkpoints (spec or zero data retention)"})
        return
    status = await driver.control.request("status")  # BridgeUnavailable: the ladder's business
    turn = int(status.get("turns") or 0)
    try:
        stored = await asyncio.to_thread(store_now, driver.backend, info.sandbox_id, info.id,
                                         turn, cmd.id)
        await _record(info, turn, stored, cmd)
    except Exception as exc:  # noqa: BLE001 - a missed checkpoint, not a failed turn
        reason = f"{type(exc).__name__}: {exc}"[:1000]
        log.warning("agent %s: checkpoint on request (command %s) failed: %s", info.id, cmd.id,
                    reason)
        await _settle(info.id, cmd, "failed",
                      {"code": "runtime.checkpoint_failed", "message": reason, "turn": turn},
                      facts=[("agent.checkpoint_failed",
                              {"turn": turn, "reason": reason, "command": cmd.id})])


def store_now(backend, sandbox_id: str, agent_id: str, turn: int, command_id: int):
    """Archive the home now (as ``checkpoints.store_checkpoint`` does) into a
    file of its own — ``<sandbox>-cmd<command>-turn-<turn>.tar.zst`` — so it
    never replaces the turn checkpoint taken when that turn finished."""
    from sandboxes.checkpoints import store_checkpoint

    return store_checkpoint(backend, sandbox_id, agent_id, turn,
                            stem=f"{sandbox_id}-cmd{command_id}")


# --- the database ------------------------------------------------------------------------------


def _outcome(info, restored: dict | None, rung: str) -> dict:
    if restored is None:
        return {"sandbox_id": info.sandbox_id, "rung": rung, "old_sandbox_id": info.sandbox_id}
    return {"sandbox_id": info.sandbox_id, "rung": restored.get("rung") or rung,
            "reason": restored.get("reason"),
            "old_sandbox_id": restored.get("old_sandbox_id") or info.sandbox_id}


@database_sync_to_async
def _row(command_id: int) -> tuple[int, dict]:
    from sessions.models import Command

    seq, result = Command.objects.filter(pk=command_id).values_list("seq", "result").first() or (0, {})
    return int(seq or 0), (result if isinstance(result, dict) else {})


@database_sync_to_async
def _rung_since(agent_id: str, seq: int) -> dict | None:
    """The newest ``agent.restored`` after ``seq`` (the command's own fact)."""
    from sessions.models import Event

    return (Event.objects.filter(agent_id=agent_id, type="agent.restored", seq__gt=seq)
            .order_by("-seq").values_list("data", flat=True).first())


@database_sync_to_async
def _progress(command_id: int, result: dict) -> None:
    from sessions.models import Command

    Command.objects.filter(pk=command_id, state="pending").update(result=result)


@database_sync_to_async
def _settle(agent_id: str, cmd: PendingCommand, state: str, result: dict, facts=()) -> None:
    """Mark the command done/failed with its result; a failure also journals
    ``command.failed`` (and ``facts``) in the same transaction."""
    from sessions import journal
    from sessions.models import Command

    with transaction.atomic():
        moved = Command.objects.filter(pk=cmd.id, state="pending").update(
            state=state, result=result, acted_at=timezone.now())
        out = list(facts)
        if moved and state == "failed":
            out.append(("command.failed", {"command": cmd.id, "verb": cmd.verb,
                                           "code": result.get("code"),
                                           "reason": result.get("message")}))
        if moved and out:
            journal.append_many(agent_id, out)


@database_sync_to_async
def _restarted(agent_id: str, command_id: int, sid: str) -> None:
    """The rung and the command's progress, together: a worker that dies after
    this does not restart the bridge a second time."""
    from sessions import journal
    from sessions.models import Command

    with transaction.atomic():
        Command.objects.filter(pk=command_id, state="pending").update(
            result={"phase": "restarted"})
        journal.append(agent_id, "agent.restored", {
            "rung": "resume", "reason": "client_resume", "old_sandbox_id": sid,
            "new_sandbox_id": sid, "command": command_id})


@database_sync_to_async
def _record(info, turn: int, stored, cmd: PendingCommand) -> None:
    """The Checkpoint row, ``agent.checkpointed`` and the command's outcome in
    one transaction, then rotation to the workspace's newest-N."""
    from datetime import timedelta

    from sandboxes.checkpoints import rotate_checkpoints
    from sandboxes.provisioning import harness_revision, profile_revision
    from sessions import journal
    from sessions.models import Agent, Checkpoint, Command

    now = timezone.now()
    with transaction.atomic():
        through = Agent.objects.filter(pk=info.id).values_list("last_seq", flat=True).first() or 0
        row = Checkpoint.objects.create(
            agent_id=info.id, sandbox_id=info.sandbox_id, turn=turn, through_seq=through,
            path=str(stored.path), bytes=stored.bytes, duration_ms=stored.ms,
            harness_revision=harness_revision(), profile_revision=profile_revision(info.spec),
            expires_at=now + timedelta(days=info.max_age_days))
        result = {"checkpoint": row.pk, "turn": turn, "bytes": stored.bytes, "ms": stored.ms,
                  "sandbox_id": info.sandbox_id}
        Command.objects.filter(pk=cmd.id, state="pending").update(
            state="done", result=result, acted_at=now)
        journal.append(info.id, "agent.checkpointed",
                       {"checkpoint": row.pk, "turn": turn, "bytes": stored.bytes,
                        "ms": stored.ms, "command": cmd.id})
    rotate_checkpoints(info.id, info.sandbox_id, keep=info.keep)
