"""The worker's side of a look at the live home (sessions/live_home.py): the
``home_snapshot`` command, acted on only while the agent's sandbox runs.

- Serving a running sandbox (sessions/worker/operations.py): the home goes
  out through the backend's tar path, compressed and capped exactly as a
  checkpoint (sandboxes/archive.py ``store_checkpoint``, under
  ``ALINEO_RESTORE_MAX_BYTES``), into ``live-homes/<agent>/`` — then the row,
  the command's outcome and ``agent.home_snapshot`` in one transaction. A
  failure removes the file, fails the command with ``home_snapshot.failed``
  and journals ``agent.home_snapshot_failed``; it never fails a turn.
- Before a driver climbs the ladder (sessions/worker/driver.py): an agent
  whose sandbox is not running (unloaded, ended, none yet) has its pending
  looks refused with the reason, so a look never wakes a sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from channels.db import database_sync_to_async

from sandboxes import archive
from sandboxes.backends.base import SandboxBackend
from sessions import live_home
from sessions.models import CommandState

from . import store
from .context import AgentInfo, PendingCommand
from .link import BridgeLink

log = logging.getLogger(__name__)

VERB = "home_snapshot"


async def take(cmd: PendingCommand, info: AgentInfo, backend: SandboxBackend,
               link: BridgeLink) -> None:
    refused = live_home.refusal(info.status, info.status_reason, info.sandbox_id,
                                info.zero_retention)
    if refused is not None and refused.code == "home_snapshot.zero_data_retention":
        await _fail(info.id, cmd, *refused)
        return
    status = await link.control.status()  # BridgeUnavailable: the ladder's business
    stored = None
    try:
        stored = await asyncio.to_thread(
            archive.store_checkpoint, backend, info.sandbox_id, info.id, status.turns,
            root=live_home.root(), stem=f"{info.sandbox_id}-live{cmd.id}")
        row = await database_sync_to_async(live_home.record)(info.id, info.sandbox_id,
                                                             status.turns, stored, cmd.id)
    except Exception as exc:  # noqa: BLE001 - a look that failed, never a failed turn
        if stored is not None:  # nothing half-written: no file without its row
            Path(stored.path).unlink(missing_ok=True)
        reason = f"{type(exc).__name__}: {exc}"[:1000]
        log.warning("agent %s: live home (command %s) failed: %s", info.id, cmd.id, reason)
        await _fail(info.id, cmd, "home_snapshot.failed", reason)
        return
    try:
        await database_sync_to_async(live_home.keep_only)(row)
    except Exception as exc:  # noqa: BLE001 - the sweep removes them when they expire
        log.info("agent %s: older live homes not removed yet: %s", info.id, exc)


async def refuse_unless_running(info: AgentInfo, pending: list[PendingCommand]) -> bool:
    """Refuse the pending looks of an agent whose sandbox is not running;
    True when any was refused."""
    refused = live_home.refusal(info.status, info.status_reason, info.sandbox_id,
                                info.zero_retention)
    looks = [c for c in pending if c.verb == VERB]
    if refused is None or not looks:
        return False
    for cmd in looks:
        await _fail(info.id, cmd, *refused)
    return True


async def _fail(agent_id: str, cmd: PendingCommand, code: str, message: str) -> None:
    # Not command.failed: a look that could not be taken is no event of the
    # agent's work (agent.home_snapshot_failed stays behind "system events").
    await store.settle_async(agent_id, cmd, CommandState.FAILED,
                             result={"code": code, "message": message},
                             facts=[(live_home.FAILED_FACT, {"command": cmd.id, "code": code,
                                                             "reason": message})])
