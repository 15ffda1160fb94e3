"""What a fresh sandbox starts from, decided from the database: the newest
usable turn checkpoint (the *restore* rung), else the conversation the
transcript holds (the *rebuild* rung); for a fork, the source's checkpoint or
its transcript through an event. sandboxes/launch.py builds the sandbox;
sessions/worker/ladder.py journals the outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from channels.db import database_sync_to_async
from django.utils import timezone

from sandboxes import archive
from sandboxes.launch import Fresh
from sessions.models import Checkpoint, Event

from .context import AgentInfo
from .settling import conversation_events, seed_conversation, settle_facts


@dataclass
class Plan:
    rung: str                      # restore | rebuild
    reason: str
    checkpoint: dict | None = None  # {id, path, turn}
    seed: dict | None = None        # {"messages", "turns"} for rebuild
    max_turn: int = 0
    # From the checkpoint's session file:
    cp_session: str = ""
    cp_head: int = 0
    cp_current_turn: int | None = None
    # The journaled cursor when it is in the checkpoint's session (launch.Fresh.bseq_floor).
    bseq_floor: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def fresh(self) -> Fresh:
        return Fresh(checkpoint=self.checkpoint["path"] if self.checkpoint else None,
                     seed=self.seed, max_turn=self.max_turn, bseq_floor=self.bseq_floor)


def _max_turn(events) -> int:
    return max((int((e["data"] or {}).get("turn") or 0) for e in events
                if e["type"] == "turn.started"), default=0)


def _from_checkpoint(row: Checkpoint, reason: str, max_turn: int) -> Plan | None:
    """Restore from ``row``; None when it holds no usable bridge session (the
    disk alone would start the conversation over, silently). Raises
    CheckpointUnreadable when its file cannot be read."""
    session = archive.session_in(row.path)
    if session is None:
        return None
    current = session.get("current")
    return Plan("restore", reason, {"id": row.pk, "path": row.path, "turn": row.turn},
                max_turn=max_turn, cp_session=session["session_id"], cp_head=session["bseq"],
                cp_current_turn=current.get("turn") if current else None)


def _rebuild(events, reason: str, settle_reason: str = "sandbox_lost") -> Plan:
    """The transcript's conversation, with the dangling turn settled as it will be."""
    settled = events + [{"type": t, "data": d} for t, d in settle_facts(events, reason=settle_reason)]
    return Plan("rebuild", reason, seed=seed_conversation(settled), max_turn=_max_turn(events))


#: Why a fresh sandbox starts from the transcript, not from a checkpoint.
REBUILD_REASONS = {
    "no_checkpoint": "it never took a checkpoint",
    "checkpoint_expired": "its newest checkpoint had expired",
    "checkpoint_deleted": "its newest checkpoint was deleted by an operator",
    "checkpoint_missing": "the file of its newest checkpoint is gone",
    "checkpoint_unusable": "its checkpoint could not be used (damaged or unsafe)",
    "checkpoint_without_session": "its checkpoint holds no bridge session to resume",
    "zero_data_retention": "its workspace keeps no checkpoints (zero data retention)",
}


@database_sync_to_async
def for_recovery(info: AgentInfo, *, skip_checkpoints: bool = False,
                 reason: str | None = None) -> Plan:
    """Restore from the newest usable checkpoint (not deleted, not expired
    by its date or the workspace's policy, file present), else rebuild, saying
    why from the agent's history (:data:`REBUILD_REASONS`)."""
    events = conversation_events(info.id)
    if skip_checkpoints:
        return _rebuild(events, reason or "checkpoint_unusable")
    now = timezone.now()
    rows = list(Checkpoint.objects.filter(agent_id=info.id).order_by("-created_at", "-id")[:20])
    for row in rows if not info.zero_retention else ():
        if (row.deleted_at is None and row.expires_under(info.max_age_days) > now and row.path
                and Path(row.path).is_file()):
            try:
                plan = _from_checkpoint(row, "sandbox_missing", _max_turn(events))
            except archive.CheckpointUnreadable:
                return _rebuild(events, reason or "checkpoint_unusable")
            if plan is None:
                return _rebuild(events, reason or "checkpoint_without_session")
            if plan.cp_session and plan.cp_session == info.session:
                plan.bseq_floor = info.cursor
            return plan
    return _rebuild(events, reason or _without_checkpoint(info, rows[0] if rows else None, now))


def _without_checkpoint(info: AgentInfo, newest: Checkpoint | None, now) -> str:
    """What became of the agent's newest checkpoint — the rows keep their
    metadata after a sweep, and the transcript says who removed it and why.
    A zero-data-retention workspace says so even when it never kept one."""
    if info.zero_retention:
        return "zero_data_retention"
    if newest is None:
        return "no_checkpoint"
    removed = (Event.objects.filter(agent_id=info.id, type__in=REMOVED, data__checkpoint=newest.pk)
               .order_by("-seq").values_list("type", "data").first())
    if removed and removed[1].get("reason") == "zero_data_retention":
        return "zero_data_retention"
    if removed and removed[0] == "agent.checkpoint_deleted":
        return "checkpoint_deleted"
    if removed or newest.expires_under(info.max_age_days) <= now:
        return "checkpoint_expired"
    if newest.deleted_at is not None:
        return "checkpoint_deleted"  # removed without a fact, by an older release
    return "checkpoint_missing"


#: The facts that say a checkpoint was removed (the sweep's, an operator's).
REMOVED = ("agent.checkpoint_expired", "agent.checkpoint_deleted")


@database_sync_to_async
def for_fork(origin: dict) -> Plan:
    """A fork's first sandbox: the source's checkpoint, or the source's
    transcript through ``at_event`` on a fresh disk."""
    source = origin["agent"]
    if origin.get("checkpoint"):
        row = Checkpoint.objects.get(pk=origin["checkpoint"], agent_id=source)
        try:
            plan = _from_checkpoint(row, "fork", row.turn)
        except archive.CheckpointUnreadable:
            plan = None
        if plan is not None:
            plan.cp_current_turn = None
            return plan
        # No session to resume (or no readable file): the disk would come without
        # its conversation; fork the conversation through its boundary instead.
        events = conversation_events(source, through=row.through_seq)
        return _rebuild(events, "fork", settle_reason="forked")
    events = conversation_events(source, through=int(origin["at_event"]))
    return _rebuild(events, "fork", settle_reason="forked")
