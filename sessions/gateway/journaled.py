"""The gateway's journal: `model.call` for every call, `model.replayed` for a
repeat of a completed one in the same turn (docs/GATEWAY.md "Never re-sent").
A call is journaled BEFORE its answer reaches the harness, so a completed call
a harness retries after a crash is always found."""

from __future__ import annotations

from dataclasses import dataclass

from channels.db import database_sync_to_async

from sandboxes.launch import Secret
from sessions import credentials, journal, leases
from sessions.models import Agent, AgentStatus, Event, Workspace

from . import budget
from .calls import CallRecord, CallStatus


@dataclass(frozen=True)
class Completed:
    seq: int
    data: dict


class CallJournal:
    """One agent's model calls, written under its driver's lease, with the
    agent's bound values redacted as the relay redacts the bridge's facts (a
    model repeats what a tool printed)."""

    def __init__(self, agent_id: str, lease: leases.Held | None = None,
                 secrets: tuple[Secret, ...] = ()):
        self.agent_id = agent_id
        self.lease = lease
        self.secrets = list(secrets)

    async def paused(self) -> bool:
        """The agent is paused (its row's status, projected from the transcript)."""
        return await database_sync_to_async(
            Agent.objects.filter(pk=self.agent_id, status=AgentStatus.PAUSED).exists)()

    async def completed(self, request_hash: str) -> Completed | None:
        return await database_sync_to_async(self._completed)(request_hash)

    async def over_budget(self) -> budget.Refusal | None:
        """The agent's workspace has reached a daily budget (budget.py)."""
        return await database_sync_to_async(self._over_budget)()

    async def exceeded(self, refusal: budget.Refusal) -> None:
        await database_sync_to_async(self._exceeded)(refusal)

    async def record(self, call: CallRecord) -> None:
        await database_sync_to_async(self._record)(call)

    async def replayed(self, request_hash: str, found: Completed, latency_ms: int) -> None:
        await database_sync_to_async(self._append)("model.replayed", {
            "turn": found.data.get("turn", 0), "request_hash": request_hash,
            "of_seq": found.seq, "latency_ms": latency_ms})

    def _turn(self) -> tuple[int, int]:
        """(seq, turn) of the agent's latest turn.started; (0, 0) before any."""
        row = (Event.objects.filter(agent_id=self.agent_id, type="turn.started")
               .order_by("-seq").values_list("seq", "data").first())
        if row is None:
            return 0, 0
        turn = row[1].get("turn") if isinstance(row[1], dict) else 0
        return row[0], turn if isinstance(turn, int) else 0

    def _completed(self, request_hash: str) -> Completed | None:
        since, _ = self._turn()
        rows = (Event.objects.filter(agent_id=self.agent_id, seq__gt=since, type="model.call")
                .order_by("-seq").values_list("seq", "data"))
        for seq, data in rows.iterator():
            if data.get("request_hash") == request_hash and data.get("status") == CallStatus.OK:
                return Completed(seq, data)
        return None

    def _over_budget(self) -> budget.Refusal | None:
        workspace = Workspace.objects.filter(agents__pk=self.agent_id).first()
        return budget.refusal(workspace, reuse=True) if workspace is not None else None

    def _exceeded(self, refusal: budget.Refusal) -> None:
        """`budget.exceeded`, once a turn: a harness that retries a refused
        call in a loop must not fill the transcript with refusals."""
        since, turn = self._turn()
        if not Event.objects.filter(agent_id=self.agent_id, seq__gt=since,
                                    type="budget.exceeded").exists():
            self._append("budget.exceeded", {"turn": turn, **refusal.fact()})

    def _record(self, call: CallRecord) -> None:
        _, turn = self._turn()
        self._append("model.call", {"turn": turn, **call.fact()})
        workspace_id = Agent.objects.filter(pk=self.agent_id).values_list("workspace_id", flat=True).first()
        if workspace_id is not None:
            budget.forget(workspace_id)

    def _append(self, etype: str, data: dict) -> None:
        if self.lease is not None:
            leases.bind(self.lease)  # fenced like the driver's own writes
        journal.append_many(self.agent_id, [(etype, credentials.redact(data, self.secrets))])
