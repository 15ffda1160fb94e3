"""The client's operations on a live agent: what the worker does for the
``reattach``, ``rebridge`` and ``checkpoint`` commands (sessions/commands/
OPERATION_VERBS), whose callers wait for an outcome.

The command is journaled first (``command.reattach`` …) like every other one;
the agent's driver hands it to :func:`act`, which stores what happened in
``Command.result`` (``GET /api/commands/{id}`` shows it):

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
- **checkpoint** takes a checkpoint of the home now (at any point of a
  turn) → ``{"checkpoint": id, "turn", "bytes", "ms"}``; a failure journals
  ``agent.checkpoint_failed`` (never a failed turn) and fails the command
  with ``runtime.checkpoint_failed`` (sessions/worker/checkpoints.py).
- **home_snapshot** copies the live home for the Files page (never a
  checkpoint) → ``{"live_home": id, "turn", "bytes", "ms", …}``
  (sessions/worker/looks.py).

Progress is kept in ``Command.result`` (``phase``), so a worker that dies in
the middle picks the command up again without doing it twice.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from channels.db import database_sync_to_async
from django.db import transaction

from sandboxes.backends.base import SandboxBackend, SandboxStatus
from sandboxes.bridge_client import BridgeError, BridgeUnavailable
from sandboxes.errors import SandboxError, SandboxNotFound
from sessions import journal
from sessions.models import Command, CommandState

from . import checkpoints, looks, store
from .context import AgentInfo, PendingCommand, SandboxGone
from .link import BridgeLink

log = logging.getLogger(__name__)

VERBS = ("reattach", "rebridge", "checkpoint", looks.VERB)
# Reattach needs a bridge that answers within 5 s. The probe gets 4 s so
# that the caller — POST, wake-up, probe, poll — hears the answer within 5 s.
ANSWER_S = 4.0
RESTART_CONNECT_S = 15.0
# Rungs after which the bridge is a freshly started process on its session.
FRESH_BRIDGE = ("resume", "restart", "restore", "rebuild")


class Acted(enum.Enum):
    DONE = "done"            # the command is settled (done or failed)
    RESTARTED = "restarted"  # the bridge was restarted: reconnect, then act again


async def act(cmd: PendingCommand, info: AgentInfo, backend: SandboxBackend,
              link: BridgeLink) -> Acted:
    """Act on one pending operation command. Raises SandboxGone when the
    sandbox is not running (the ladder's business), BridgeUnavailable when
    the bridge stopped answering."""
    seq, progress = await store.command_row(cmd.id)
    if cmd.verb == "reattach":
        await _reattach(cmd, info, backend, link, seq)
    elif cmd.verb == "rebridge":
        return await _rebridge(cmd, info, backend, link, seq, progress)
    elif cmd.verb == "checkpoint":
        await _checkpoint(cmd, info, backend, link)
    elif cmd.verb == looks.VERB:
        await looks.take(cmd, info, backend, link)
    return Acted.DONE


# --- reattach ---------------------------------------------------------------------------


async def _reattach(cmd: PendingCommand, info: AgentInfo, backend: SandboxBackend,
                    link: BridgeLink, seq: int) -> None:
    try:
        status = await link.control.status(timeout=ANSWER_S)
    except BridgeUnavailable as exc:
        state = await asyncio.to_thread(backend.status, info.sandbox_id)
        if state in (SandboxStatus.MISSING, SandboxStatus.EXITED):
            await store.progress(cmd.id, {"phase": "recovering", "sandbox_state": state.value})
            raise SandboxGone(f"sandbox {info.sandbox_id} is {state}") from exc
        message = (f"the bridge in sandbox {info.sandbox_id} did not answer within "
                   f"{ANSWER_S:g} s ({exc.message}); resume the agent to restart it")
        await store.settle_async(info.id, cmd, CommandState.FAILED, failure=(
            "runtime.bridge_unavailable", message), result={
            "code": "runtime.bridge_unavailable", "sandbox_id": info.sandbox_id,
            "message": message})
        raise
    restored = await store.rung_since(info.id, seq)
    await store.settle_async(info.id, cmd, CommandState.DONE, result={
        **_outcome(info, restored, "reattach"), "state": status.state.value,
        "turn": status.turn.turn if status.turn else None})


# --- rebridge (the client's resume) ----------------------------------------------------------


async def _rebridge(cmd: PendingCommand, info: AgentInfo, backend: SandboxBackend,
                    link: BridgeLink, seq: int, progress: dict) -> Acted:
    restored = await store.rung_since(info.id, seq)
    if progress.get("phase") == "restarted" or (restored and restored.get("rung") in FRESH_BRIDGE):
        await store.settle_async(info.id, cmd, CommandState.DONE,
                                 result=_outcome(info, restored, "resume"))
        return Acted.DONE
    sid = info.sandbox_id
    await store.progress(cmd.id, {"phase": "restarting"})
    try:
        # A clean stop: the bridge settles a running turn (turn.interrupted)
        # and saves its session before it exits.
        await link.control.shutdown(timeout=ANSWER_S)
    except BridgeError as exc:
        log.info("agent %s: bridge shutdown before resume: %s", info.id, exc)
    await link.disconnect()
    try:
        await asyncio.to_thread(backend.stop, sid, 10)
        await asyncio.to_thread(backend.start, sid)
    except SandboxNotFound as exc:
        raise SandboxGone(f"sandbox {sid} is gone: {exc}") from exc
    except SandboxError as exc:
        if exc.permanent:
            raise SandboxGone(f"sandbox {sid} cannot start: {exc}") from exc
        raise
    await _restarted(info.id, cmd.id, sid)
    log.info("agent %s: bridge restarted in sandbox %s on request (command %s)", info.id,
             sid[:16], cmd.id)
    if not await link.connect(RESTART_CONNECT_S):
        raise BridgeUnavailable(f"the bridge in sandbox {sid} did not answer after its restart")
    return Acted.RESTARTED


@database_sync_to_async
def _restarted(agent_id: str, command_id: int, sid: str) -> None:
    """The rung and the command's progress, together: a worker that dies after
    this does not restart the bridge a second time."""
    with transaction.atomic():
        Command.objects.filter(pk=command_id, state=CommandState.PENDING).update(
            result={"phase": "restarted"})
        journal.append(agent_id, "agent.restored", {
            "rung": "resume", "reason": "client_resume", "old_sandbox_id": sid,
            "new_sandbox_id": sid, "command": command_id})


# --- checkpoint --------------------------------------------------------------------------------


async def _checkpoint(cmd: PendingCommand, info: AgentInfo, backend: SandboxBackend,
                      link: BridgeLink) -> None:
    if not info.takes_checkpoints:
        message = "this agent takes no checkpoints (spec or zero data retention)"
        await store.settle_async(info.id, cmd, CommandState.FAILED,
                                 failure=("checkpoint.disabled", message),
                                 result={"code": "checkpoint.disabled", "message": message})
        return
    status = await link.control.status()  # BridgeUnavailable: the ladder's business
    await checkpoints.on_request(info, backend, status.turns, cmd)


def _outcome(info: AgentInfo, restored: dict | None, rung: str) -> dict:
    if restored is None:
        return {"sandbox_id": info.sandbox_id, "rung": rung, "old_sandbox_id": info.sandbox_id}
    return {"sandbox_id": info.sandbox_id, "rung": restored.get("rung") or rung,
            "reason": restored.get("reason"),
            "old_sandbox_id": restored.get("old_sandbox_id") or info.sandbox_id}
