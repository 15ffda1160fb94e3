"""Budgets per workspace and UTC day (docs/GATEWAY.md "Budgets"): what the
workspace's agents spent today, folded from their `model.call` facts, and the
refusal the gateway gives once a budget is reached. The facts are the truth;
nothing here is a counter that could drift from them."""

from __future__ import annotations

import enum
import math
from time import monotonic as _clock
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone

from sessions.models import BUDGET_MAX_TOKENS, BUDGET_MAX_USD, Agent, Event, Workspace

from .usage import TOKENS


class Limit(str, enum.Enum):
    TOKENS = "tokens"
    COST = "cost_usd"


@dataclass(frozen=True)
class Spent:
    day: str              # the UTC day, 2026-12-01
    calls: int
    tokens: int
    cost_usd: float


@dataclass(frozen=True)
class Refusal:
    """A budget reached: which one, what was spent, what was allowed."""
    limit: Limit
    spent: float
    budget: float
    day: str

    def message(self) -> str:
        what = ("tokens" if self.limit is Limit.TOKENS else "USD")
        spent = f"{int(self.spent):,}" if self.limit is Limit.TOKENS else f"{self.spent:.4f}"
        budget = f"{int(self.budget):,}" if self.limit is Limit.TOKENS else f"{self.budget:.4f}"
        return (f"budget_exceeded: the workspace's daily budget is spent ({spent} of {budget} "
                f"{what} on {self.day} UTC); an operator can raise it, or it renews at "
                "00:00 UTC")

    def fact(self) -> dict:
        return {"limit": self.limit.value, "spent": self.spent, "budget": self.budget,
                "day": self.day}


class BudgetInvalid(ValueError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def day_start(now: datetime | None = None) -> datetime:
    now = now or datetime.now(timezone.utc)
    return datetime.combine(now.astimezone(timezone.utc).date(), time(0), tzinfo=timezone.utc)


def spent_today(workspace_id: int, now: datetime | None = None) -> Spent:
    """Tokens (input, output and cache) and cost of the workspace's model calls
    since 00:00 UTC. A replay is not a call (it costs nothing); an unpriced
    call counts against a token budget only."""
    start = day_start(now)
    agents = set(Agent.objects.filter(workspace_id=workspace_id).values_list("pk", flat=True))
    # The day's model calls through the partial index on their time alone (an agent filter in
    # SQL would lead SQLite's planner to the agent index: every fact of every agent, all time),
    # and only the two small values, never the response's JSON.
    rows = (Event.objects.filter(type="model.call", ts__gte=start, ts__lt=start + timedelta(days=1))
            .order_by().values_list("agent_id", "data__usage", "data__cost_usd"))
    calls, tokens, cost = 0, 0, 0.0
    for agent_id, usage, value in rows.iterator():
        if agent_id not in agents:
            continue
        calls += 1
        usage = usage if isinstance(usage, dict) else {}
        tokens += sum(v for k in TOKENS if isinstance(v := usage.get(k), int)
                      and not isinstance(v, bool) and v > 0)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            cost += value
    return Spent(start.date().isoformat(), calls, tokens, round(cost, 8))


#: How long the gateway may reuse a workspace's spending of the day (seconds). A call this
#: process journals forgets it at once; calls journaled by other workers are seen this late.
FRESH_S = 2.0
_recent: dict[int, tuple[float, Spent]] = {}


def forget(workspace_id: int | None = None) -> None:
    """This process journaled a call of the workspace (None: of any): its next
    check reads again."""
    if workspace_id is None:
        _recent.clear()
    else:
        _recent.pop(workspace_id, None)


def _spent(workspace_id: int, now: datetime | None, reuse: bool) -> Spent:
    """Today's spending; at the gateway (reuse) read at most every FRESH_S per
    workspace, so a workspace's many agents do not each fold the day per call."""
    seen = _recent.get(workspace_id) if reuse and now is None else None
    if seen is not None and _clock() - seen[0] < FRESH_S and seen[1].day == day_start().date().isoformat():
        return seen[1]
    spent = spent_today(workspace_id, now)
    if reuse and now is None:
        _recent[workspace_id] = (_clock(), spent)
    return spent


def refusal(workspace: Workspace, now: datetime | None = None, *,
            reuse: bool = False) -> Refusal | None:
    """The budget the workspace has reached today, if any (None: no budget set,
    or some left). Checked before each call: the call that crosses a budget is
    answered, the next one refused."""
    tokens, usd = workspace.budget_tokens_per_day, workspace.budget_usd_per_day
    if tokens is None and usd is None:
        return None
    spent = _spent(workspace.pk, now, reuse)
    if tokens is not None and spent.tokens >= tokens:
        return Refusal(Limit.TOKENS, spent.tokens, tokens, spent.day)
    if usd is not None and spent.cost_usd >= usd:
        return Refusal(Limit.COST, spent.cost_usd, usd, spent.day)
    return None


def summary(workspace: Workspace, now: datetime | None = None) -> dict:
    """The budget and today's spending (GET /api/workspaces/{name}/budget, the agent page)."""
    spent = spent_today(workspace.pk, now)
    return {"workspace": workspace.name, "tokens_per_day": workspace.budget_tokens_per_day,
            "usd_per_day": workspace.budget_usd_per_day,
            "today": {"day": spent.day, "calls": spent.calls, "tokens": spent.tokens,
                      "cost_usd": spent.cost_usd},
            "exceeded": (r := refusal(workspace, now)) is not None and r.limit.value}


FIELDS = {"tokens_per_day": "budget_tokens_per_day", "usd_per_day": "budget_usd_per_day"}


def parse(body) -> dict[str, int | float | None]:
    """The budget fields a client sets (a JSON object with either or both;
    null removes one), as model field names; BudgetInvalid otherwise."""
    if not isinstance(body, dict) or not body:
        raise BudgetInvalid("budget.invalid", "Send a JSON object with tokens_per_day and/or "
                                              "usd_per_day (a number, or null for no budget).")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BudgetInvalid("budget.unknown_fields",
                            f"Unknown field(s): {', '.join(k[:40] for k in unknown[:10])}; "
                            "use tokens_per_day and usd_per_day.")
    out: dict[str, int | float | None] = {}
    if "tokens_per_day" in body:
        out[FIELDS["tokens_per_day"]] = _tokens(body["tokens_per_day"])
    if "usd_per_day" in body:
        out[FIELDS["usd_per_day"]] = _usd(body["usd_per_day"])
    return out


def _tokens(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= BUDGET_MAX_TOKENS:
        raise BudgetInvalid("budget.tokens_per_day",
                            f"tokens_per_day must be a whole number from 1 to {BUDGET_MAX_TOKENS:,}, "
                            "or null for no token budget.")
    return value


def _usd(value) -> float | None:
    if value is None:
        return None
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and 0.0001 <= value <= BUDGET_MAX_USD)
    if not ok:
        raise BudgetInvalid("budget.usd_per_day",
                            f"usd_per_day must be a number from 0.0001 to {BUDGET_MAX_USD:,}, "
                            "or null for no cost budget.")
    return float(value)
