"""The worker's reads and writes of the database, each one transaction, run
off the event loop (``database_sync_to_async``). Facts go through
sessions.journal like every other writer's."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from sandboxes.bridge.protocol import BridgeEvent
from sessions import credentials, journal
from sessions.models import Agent, Command, CommandState, Event, iso_ts

from . import slots
from .context import AgentInfo, PendingCommand

#: Verbs whose Command row carries the text of its fact (``command.<verb>``).
TEXT_VERBS = ("prompt", "steer")


@database_sync_to_async
def load(agent_id: str) -> AgentInfo | None:
    a = Agent.objects.select_related("workspace").filter(pk=agent_id).first()
    if a is None:
        return None
    ws = a.workspace
    spec = dict(a.spec or {})
    return AgentInfo(a.id, spec, a.status, a.sandbox_id, a.bridge_cursor,
                     a.bridge_session, ws.zero_data_retention, ws.checkpoint_max_age_days,
                     ws.keep_newest_checkpoints,
                     tuple(credentials.secrets_for(ws.id, spec.get("credentials") or [])),
                     a.sandbox_host, a.sandbox_slot, a.workspace_id, a.status_reason)


@database_sync_to_async
def pending(agent_id: str) -> list[PendingCommand]:
    rows = list(Command.objects.filter(agent_id=agent_id, state=CommandState.PENDING)
                .order_by("id").values_list("id", "verb", "seq"))
    seqs = [seq for _, verb, seq in rows if verb in TEXT_VERBS and seq]
    texts = dict(Event.objects.filter(agent_id=agent_id, seq__in=seqs).values_list("seq", "data"))
    return [PendingCommand(cid, verb, (texts.get(seq) or {}).get("text")) for cid, verb, seq in rows]


@database_sync_to_async
def paused(agent_id: str) -> bool:
    """The newest pause/resume the worker acted on decides (it survives a restart)."""
    last = (Command.objects.filter(agent_id=agent_id, state=CommandState.DONE,
                                   verb__in=("pause", "resume"))
            .order_by("-id").values_list("verb", flat=True).first())
    return last == "pause"


def settle(agent_id: str, cmd: PendingCommand, state: str, *, failure: tuple[str, str] | None = None,
           result: dict | None = None, facts=(), final=None) -> bool:
    """Mark a pending command done or failed (with its ``result``), and in the
    same transaction journal ``facts``, then ``command.failed {command, verb,
    code, reason}`` for a ``failure``, then ``final``. False when the command
    was no longer pending (then nothing is journaled)."""
    with transaction.atomic():
        changes = {"state": state, "acted_at": timezone.now()}
        if result is not None:
            changes["result"] = result
        moved = Command.objects.filter(pk=cmd.id, state=CommandState.PENDING).update(**changes)
        out = list(facts)
        if failure is not None:
            code, reason = failure
            out.append(("command.failed", {"command": cmd.id, "verb": cmd.verb,
                                           "code": code, "reason": reason}))
        if final is not None:
            out.append(final)
        if moved and out:
            journal.append_many(agent_id, out)
        return bool(moved)


settle_async = database_sync_to_async(settle)


@database_sync_to_async
def sandbox_started(agent_id: str, sandbox_id: str, backend: str, host: str) -> None:
    """Record a first sandbox; the agent becomes idle only if it was starting:
    a pause sent while the sandbox was being made must hold."""
    with transaction.atomic():
        status = Agent.objects.filter(pk=agent_id).values_list("status", flat=True).first()
        facts = [("agent.sandbox", {"sandbox_id": sandbox_id, "backend": backend, "host": host})]
        if status == "starting":
            facts.append(("agent.status", {"status": "idle", "reason": "sandbox started"}))
        journal.append_many(agent_id, facts)


@database_sync_to_async
def fork_origin(agent_id: str) -> dict | None:
    """Where a forked agent starts from (its `agent.spawned` fact), or None."""
    data = (Event.objects.filter(agent_id=agent_id, type="agent.spawned").order_by("seq")
            .values_list("data", flat=True).first())
    return (data or {}).get("fork") or None


@database_sync_to_async
def append(agent_id: str, facts) -> None:
    journal.append_many(agent_id, facts)


@database_sync_to_async
def unloaded(agent_id: str, facts) -> None:
    """Idle unload's facts, and the agent's sandbox slot given back with them."""
    with transaction.atomic():
        journal.append_many(agent_id, facts)
        slots.release(agent_id)


@database_sync_to_async
def command_row(command_id: int) -> tuple[int, dict]:
    """The command's own fact's seq and the progress stored in its result."""
    seq, result = (Command.objects.filter(pk=command_id).values_list("seq", "result").first()
                   or (0, {}))
    return int(seq or 0), (result if isinstance(result, dict) else {})


@database_sync_to_async
def progress(command_id: int, result: dict) -> None:
    Command.objects.filter(pk=command_id, state=CommandState.PENDING).update(result=result)


@database_sync_to_async
def rung_since(agent_id: str, seq: int) -> dict | None:
    """The newest ``agent.restored`` after ``seq``."""
    return (Event.objects.filter(agent_id=agent_id, type="agent.restored", seq__gt=seq)
            .order_by("-seq").values_list("data", flat=True).first())


@database_sync_to_async
def request_events(agent_id: str, request_ids: list[str]) -> list[BridgeEvent]:
    """The journaled ``request.spawn``/``request.memory`` events with these ids
    (a bridge still waits for them after a worker died before replying)."""
    if not request_ids:
        return []
    rows = (Event.objects.filter(agent_id=agent_id, type__in=("request.spawn", "request.memory"))
            .order_by("-seq")[:200])
    wanted, out = set(request_ids), []
    for row in reversed(list(rows)):
        if row.data.get("request_id") in wanted:
            wanted.discard(row.data["request_id"])
            out.append(BridgeEvent(int(row.data.get("bseq") or 0), row.type, iso_ts(row.ts),
                                   row.data))
    return out
