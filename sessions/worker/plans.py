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
from sessions.models import Checkpoint

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
    extra: dict = field(default_factory=dict)

    @property
    def fresh(self) -> Fresh:
        return Fresh(checkpoint=self.checkpoint["path"] if self.checkpoint else None,
                     seed=self.seed, max_turn=self.max_turn)


def _max_turn(events) -> int:
    return max((int((e["data"] or {}).get("turn") or 0) for e in events
                if e["type"] == "turn.started"), default=0)


def _from_checkpoint(row: Checkpoint, reason: str, max_turn: int) -> Plan:
    session = archive.session_in(row.path) or {}
    current = session.get("current") or None
    return Plan("restore", reason, {"id": row.pk, "path": row.path, "turn": row.turn},
                max_turn=max_turn, cp_session=str(session.get("session_id") or ""),
                cp_head=int(session.get("bseq") or 0),
                cp_current_turn=(current or {}).get("turn") if current else None)


def _rebuild(events, reason: str, settle_reason: str = "sandbox_lost") -> Plan:
    """The transcript's conversation, with the dangling turn settled as it will be."""
    settled = events + [{"type": t, "data": d} for t, d in settle_facts(events, reason=settle_reason)]
    return Plan("rebuild", reason, seed=seed_conversation(settled), max_turn=_max_turn(events))


@database_sync_to_async
def for_recovery(info: AgentInfo, *, skip_checkpoints: bool = False,
                 reason: str | None = None) -> Plan:
    """Restore from the newest usable checkpoint (not deleted, not expired,
    file present), else rebuild (``no_checkpoint``, or ``checkpoint_expired``
    when the newest one expired)."""
    events = conversation_events(info.id)
    if not skip_checkpoints and not info.zero_retention:
        now = timezone.now()
        rows = list(Checkpoint.objects.filter(agent_id=info.id, deleted_at__isnull=True)
                    .order_by("-created_at", "-id")[:20])
        for row in rows:
            if row.expires_at > now and row.path and Path(row.path).is_file():
                return _from_checkpoint(row, "sandbox_missing", _max_turn(events))
        if rows and rows[0].expires_at <= now:
            reason = reason or "checkpoint_expired"
    return _rebuild(events, reason or "no_checkpoint")


@database_sync_to_async
def for_fork(origin: dict) -> Plan:
    """A fork's first sandbox: the source's checkpoint, or the source's
    transcript through ``at_event`` on a fresh disk."""
    source = origin["agent"]
    if origin.get("checkpoint"):
        row = Checkpoint.objects.get(pk=origin["checkpoint"], agent_id=source)
        plan = _from_checkpoint(row, "fork", row.turn)
        plan.cp_current_turn = None
        return plan
    events = conversation_events(source, through=int(origin["at_event"]))
    return _rebuild(events, "fork", settle_reason="forked")
