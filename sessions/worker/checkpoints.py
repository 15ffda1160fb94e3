"""Checkpoint bookkeeping, one copy for the turn checkpoint and the one taken
on request: the archive (sandboxes/archive.py), then the Checkpoint row and
its ``agent.checkpointed`` fact in one transaction, then rotation to the
workspace's newest N for the sandbox. A failure is ``agent.checkpoint_failed``
— never a failed turn, never a success."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from sandboxes import archive
from sandboxes.backends import trees
from sandboxes.backends.base import SandboxBackend
from sandboxes.launch import harness_revision, profile_revision
from sessions import journal
from sessions.models import Agent, Checkpoint, Command, CommandState

from . import store
from .context import AgentInfo, PendingCommand

log = logging.getLogger(__name__)


async def after_turn(info: AgentInfo, backend: SandboxBackend, turn: int, through_seq: int) -> None:
    """The turn checkpoint, when the spec asks for one: ``<sandbox>-turn-<n>``."""
    if not info.takes_checkpoints:
        return
    try:
        stored = await asyncio.to_thread(archive.store_checkpoint, backend, info.sandbox_id,
                                         info.id, turn)
        await database_sync_to_async(record)(info, turn, stored, through_seq=through_seq)
    except Exception as exc:  # noqa: BLE001 - a missed checkpoint, not a failed turn
        log.warning("agent %s: checkpoint of turn %s failed: %s", info.id, turn, exc)
        await store.append(info.id, [("agent.checkpoint_failed", {"turn": turn, "reason": _why(exc)})])
        return
    await queue_tree(info, backend, stored.path)


async def on_request(info: AgentInfo, backend: SandboxBackend, turn: int,
                     cmd: PendingCommand) -> None:
    """A checkpoint now (at any point of a turn), in a file of its own —
    ``<sandbox>-cmd<command>-turn-<n>`` — so it never replaces the checkpoint
    taken when that turn finishes. Settles the command either way."""
    try:
        stored = await asyncio.to_thread(archive.store_checkpoint, backend, info.sandbox_id,
                                         info.id, turn, stem=f"{info.sandbox_id}-cmd{cmd.id}")
        await database_sync_to_async(record)(info, turn, stored, command=cmd)
    except Exception as exc:  # noqa: BLE001 - a missed checkpoint, not a failed turn
        reason = _why(exc)
        log.warning("agent %s: checkpoint on request (command %s) failed: %s", info.id, cmd.id,
                    reason)
        await store.settle_async(
            info.id, cmd, CommandState.FAILED,
            result={"code": "runtime.checkpoint_failed", "message": reason, "turn": turn},
            failure=("runtime.checkpoint_failed", reason),
            facts=[("agent.checkpoint_failed", {"turn": turn, "reason": reason,
                                                "command": cmd.id})])
        return
    await queue_tree(info, backend, stored.path)


async def queue_tree(info: AgentInfo, backend: SandboxBackend, path) -> None:
    """:func:`prepare_tree`, off the loop; a failure only costs speed."""
    try:
        await asyncio.to_thread(prepare_tree, backend, path)  # may probe the engine once
    except Exception as exc:  # noqa: BLE001 - a restore then extracts, as before
        log.warning("agent %s: the tree of checkpoint %s was not queued: %s", info.id, path, exc)


def prepare_tree(backend: SandboxBackend, path) -> None:
    """Have the checkpoint extracted in the background, so that a restore or
    a fork from it lays its home over the tree (sandboxes/backends/trees.py)."""
    if not backend.prepares_trees():
        return
    if backend.name not in PREPARERS:
        PREPARERS[backend.name] = trees.Preparer(backend.tree_keys_in_use, backend.tree_owners)
    PREPARERS[backend.name].submit(path)


#: The background preparer of each backend this process drives (made at its first checkpoint).
PREPARERS: dict[str, trees.Preparer] = {}


def record(info: AgentInfo, turn: int, stored: archive.StoredCheckpoint, *,
           through_seq: int | None = None, command: PendingCommand | None = None) -> int:
    """The Checkpoint row and ``agent.checkpointed`` (and, for a checkpoint on
    request, the command's outcome) in one transaction; then rotation."""
    now = timezone.now()
    with transaction.atomic():
        if through_seq is None:
            through_seq = Agent.objects.filter(pk=info.id).values_list("last_seq", flat=True).first() or 0
        row = Checkpoint.objects.create(
            agent_id=info.id, sandbox_id=info.sandbox_id, turn=turn, through_seq=through_seq,
            path=str(stored.path), bytes=stored.bytes, duration_ms=stored.ms,
            harness_revision=harness_revision(), profile_revision=profile_revision(info.spec),
            expires_at=now + timedelta(days=info.max_age_days))
        fact = {"checkpoint": row.pk, "turn": turn, "bytes": stored.bytes, "ms": stored.ms}
        if command is not None:
            Command.objects.filter(pk=command.id, state=CommandState.PENDING).update(
                state=CommandState.DONE, acted_at=now,
                result={**fact, "sandbox_id": info.sandbox_id})
            fact["command"] = command.id
        journal.append(info.id, "agent.checkpointed", fact)
    rotate(info.id, info.sandbox_id, keep=info.keep)
    return row.pk


def rotate(agent_id: str, sandbox_id: str, keep: int = archive.KEEP_CHECKPOINTS) -> list[int]:
    """The Checkpoint rows of one sandbox beyond the newest ``keep`` get their
    files deleted and ``deleted_at`` set; returns their ids. Files go first: a
    crash in between leaves a row pointing at a missing file, which a restore
    skips (it is never the newest)."""
    rows = list(Checkpoint.objects.filter(agent_id=agent_id, sandbox_id=sandbox_id,
                                          deleted_at__isnull=True))
    ids = [r.pk for r in archive.rotate_rows(rows, keep)]
    if ids:
        Checkpoint.objects.filter(pk__in=ids, deleted_at__isnull=True).update(
            deleted_at=timezone.now())
    return ids


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]
