"""Held credentials: a binding with `"approval": "hold"` reaches a sandbox only
after an operator approved it for THAT sandbox start.

The transcript is the truth. An approval counts for one sandbox start: every
`agent.sandbox` fact (a first sandbox, a restore, a rebuild, a fork's first
sandbox) consumes it. So, reading the facts after the newest `agent.sandbox`:

- `credential.approval_requested {bindings, reason, previous}` — the worker
  was about to create a sandbox and held bindings were not approved
  (`reason`: "first_start" or "sandbox_replaced"). Journaled once per start,
  with an `agent.status` that says what the agent waits for ("starting" on a
  first start, "restoring" when its sandbox is being replaced).
- `credential.approved {bindings, by, command}` — `POST /api/agents/{id}/approve`.
- `credential.denied {bindings, by, reason, command}` — `POST /api/agents/{id}/deny`:
  the request is closed and the agent cannot start; the worker ends it as
  `agent.lost` with the denial as its reason (:func:`denial`).

The worker (sessions/worker/driver.py at a first start, sessions/worker/
ladder.py before a fresh sandbox) calls :func:`ensure_approved` right before
it creates the sandbox; False means "wait": the driver returns and the
supervisor's scan, or the approval's wake-up, runs it again. Nothing is lost
silently and no secret is injected before its approval. The operator's
command is sessions/commands/approve.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from . import journal
from .models import ENDED, Agent, AgentStatus, Event

REQUESTED = "credential.approval_requested"
APPROVED = "credential.approved"
DENIED = "credential.denied"
SANDBOX = "agent.sandbox"
FIRST_START = "first_start"
SANDBOX_REPLACED = "sandbox_replaced"
REASONS = (FIRST_START, SANDBOX_REPLACED)
#: Statuses an agent goes back to once its replaced sandbox is up (else idle).
_BACK_TO = ("idle", "interrupted", "running")


def held_bindings(spec: Any) -> tuple[str, ...]:
    """Names of the spec's bindings with approval "hold", in spec order, once each."""
    bindings = (spec or {}).get("credentials") if isinstance(spec, dict) else None
    names = [b.get("name") for b in bindings or [] if isinstance(b, dict)
             and b.get("approval") == "hold" and isinstance(b.get("name"), str)]
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class ApprovalState:
    held: tuple[str, ...]
    requested: dict | None  # the open request since the newest sandbox start: its data + "seq"
    approved: frozenset[str]
    denied: dict | None = None  # the operator's refusal of that request: its data + "seq"

    @property
    def missing(self) -> tuple[str, ...]:
        """Held bindings not yet approved for the next sandbox start."""
        return tuple(n for n in self.held if n not in self.approved)

    @property
    def ready(self) -> bool:
        """The next sandbox may start (with every bound secret)."""
        return not self.missing

    @property
    def waiting(self) -> bool:
        """An approval was asked for and is still (partly) outstanding."""
        return self.requested is not None and self.denied is None and not self.ready


def approval_state(spec: Any, events: Iterable[Any]) -> ApprovalState:
    """Pure: the approval state after `events` (dicts {"seq","type","data"} or
    (seq, type, data) tuples, in seq order). A sandbox start consumes every
    approval and closes the request."""
    requested: dict | None = None
    denied: dict | None = None
    approved: set[str] = set()
    for event in events:
        seq, etype, data = _unpack(event)
        if etype == SANDBOX:
            requested, approved, denied = None, set(), None
        elif etype == REQUESTED:
            requested, denied = {**data, "seq": seq}, None
        elif etype == APPROVED and requested is not None and denied is None:
            approved |= {n for n in data.get("bindings") or [] if isinstance(n, str)}
        elif etype == DENIED and requested is not None:
            denied = {**data, "seq": seq}
    return ApprovalState(held_bindings(spec), requested, frozenset(approved), denied)


def denial_reason(denied: dict) -> str:
    """The agent.lost reason of a denial: which bindings, who, and why."""
    names = [n for n in denied.get("bindings") or [] if isinstance(n, str)]
    why = str(denied.get("reason") or "").strip()
    return (f"credential(s) {', '.join(names)} denied by {denied.get('by') or 'an operator'}"
            + (f": {why}" if why else ""))


def waiting_reason(names: Iterable[str]) -> str:
    return f"waiting for approval of credential(s) {', '.join(names)}"


def _unpack(event) -> tuple[int, str, dict]:
    if isinstance(event, dict):
        seq, etype, data = event.get("seq"), event.get("type"), event.get("data")
    else:
        seq, etype, data = event
    return seq, etype, data if isinstance(data, dict) else {}


# --- database ------------------------------------------------------------------------------


def state_of(agent: Agent) -> ApprovalState:
    """The agent's approval state, read from its transcript (the facts after its
    newest sandbox start)."""
    held = held_bindings(agent.spec)
    if not held:
        return ApprovalState((), None, frozenset())
    since = (Event.objects.filter(agent_id=agent.pk, type=SANDBOX).order_by("-seq")
             .values_list("seq", flat=True).first()) or 0
    rows = (Event.objects.filter(agent_id=agent.pk, seq__gt=since,
                                 type__in=(REQUESTED, APPROVED, DENIED))
            .order_by("seq").values_list("seq", "type", "data"))
    return approval_state(agent.spec, rows)


def ensure_approved(agent_id: str, reason: str) -> bool:
    """The worker is about to create a sandbox for `agent_id`: True when it may
    (no held binding, or every one approved for this start). Otherwise journal
    `credential.approval_requested` (once per start) with a status that says
    what the agent waits for, and return False. Blocking (call from a thread)."""
    assert reason in REASONS, reason
    with transaction.atomic():
        agent = Agent.objects.select_for_update(of=("self",)).filter(pk=agent_id).first()
        if agent is None:
            return False
        state = state_of(agent)
        if state.ready:
            return True
        if state.denied is not None:
            return False  # refused: the worker ends the agent (denial())
        if state.requested is None:
            facts = [(REQUESTED, {"bindings": list(state.missing), "reason": reason,
                                  "previous": agent.status})]
            if agent.status not in ENDED and agent.status != AgentStatus.PAUSED:
                status = AgentStatus.STARTING if reason == FIRST_START else AgentStatus.RESTORING
                facts.append(("agent.status", {"status": status.value, "previous": agent.status,
                                               "reason": waiting_reason(state.missing)}))
            journal.append_many(agent_id, facts)
        return False


def denial(agent_id: str) -> str | None:
    """The worker found the agent not approved: the agent.lost reason when an
    operator denied the request (the agent cannot start), else None (it waits)."""
    agent = Agent.objects.filter(pk=agent_id).first()
    state = state_of(agent) if agent is not None else None
    return denial_reason(state.denied) if state is not None and state.denied else None


def status_after_replacement(agent_id: str) -> tuple[str, dict] | None:
    """For the transaction that commits a replacement sandbox: the
    `agent.status` fact that ends a "restoring … waiting for approval" status
    (back to what the agent was), or None when there is nothing to undo."""
    row = Agent.objects.filter(pk=agent_id).values_list("status", "status_reason").first()
    if row is None or row[0] != AgentStatus.RESTORING or not row[1].startswith("waiting for approval"):
        return None
    data = (Event.objects.filter(agent_id=agent_id, type=REQUESTED).order_by("-seq")
            .values_list("data", flat=True).first()) or {}
    back = data.get("previous") if data.get("previous") in _BACK_TO else "idle"
    return ("agent.status", {"status": back, "reason": "sandbox replaced after approval"})
