"""The tree as the live stream reads it (GET /api/workspaces/{name}/stream,
sessions/api/tree_tail.py): one query for the workspace's agents' heads, and a
node drawn (sessions/_tree_node_main.html, the template the page uses) only for
the agents whose head moved since the last read.

The tree's cursor is its *tree seq*: the sum of the last_seq of the
workspace's agents. Every fact appended to any of them (a status, a turn's
step, a restore, a new child's ``agent.spawned``) raises it, it never goes
down while agents are only added, and every process computes the same number
from the database, so a cursor survives a reconnect to another process.

A node is drawn without a request: it holds no CSRF token (htmx sends the
X-CSRFToken header the page set on <body>) and alineo.js gives each form a
fresh Idempotency-Key when it inserts the node, so the same bytes can go to
every viewer of the workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import OuterRef, QuerySet, Subquery
from django.template.loader import render_to_string

from ..forms import TextCommandForm
from ..models import Agent, Event
from . import restores
from .common import summarize

#: What the stream compares between two reads of an agent.
Head = tuple[str | None, int, str, datetime]  # parent, last_seq, status, updated_at


@dataclass(frozen=True)
class Node:
    """One agent's node as the stream sends it (JSON: agent, parent, status, html)."""

    agent: str
    parent: str | None
    status: str
    html: str

    def as_dict(self) -> dict:
        return {"agent": self.agent, "parent": self.parent, "status": self.status, "html": self.html}


@dataclass(frozen=True)
class TreeRead:
    """One read of a workspace's tree: its seq, every head, and the nodes that moved."""

    seq: int
    heads: dict[str, Head]
    order: list[str]  # agent ids, oldest first: a parent before its children
    nodes: list[Node] = field(default_factory=list)


def tree_seq(last_seqs) -> int:
    return sum(last_seqs)


def read_tree(workspace_id: int, known: dict[str, Head]) -> TreeRead:
    """The workspace's heads, and a node for each agent not in `known` as it is now."""
    rows = list(Agent.objects.filter(workspace_id=workspace_id).order_by("created_at", "id")
                .values_list("id", "parent_id", "last_seq", "status", "updated_at"))
    heads = {r[0]: r[1:] for r in rows}
    order = [r[0] for r in rows]
    moved = [agent_id for agent_id in order if known.get(agent_id) != heads[agent_id]]
    return TreeRead(tree_seq(r[2] for r in rows), heads, order, draw_nodes(moved) if moved else [])


def with_last_activity(agents: QuerySet) -> QuerySet:
    """The agents, each with `last_ts`: the time of its newest fact."""
    newest = Event.objects.filter(agent=OuterRef("pk"), seq=OuterRef("last_seq")).values("ts")[:1]
    return agents.annotate(last_ts=Subquery(newest))


def node_summaries(agents) -> dict[str, dict]:
    """Each agent's node as the tree draws it, the page and the stream alike:
    its summary, where a fork came from, the most severe restore of the last
    day (sessions/dashboard/restores.py) and its last activity."""
    ids = [a.id for a in agents]
    origins = fork_origins(ids)
    notable = restores.notable(ids)
    return {a.id: {**summarize(a), "forked_from": origins.get(a.id), "restore": notable.get(a.id),
                   "last_activity": getattr(a, "last_ts", None) or a.created_at}
            for a in agents}


def draw_nodes(agent_ids: list[str]) -> list[Node]:
    found = with_last_activity(Agent.objects.filter(pk__in=agent_ids).select_related("workspace"))
    agents = {a.id: a for a in found}
    summaries = node_summaries(list(agents.values()))
    forms = node_forms()
    nodes = []
    for agent_id in agent_ids:
        agent = agents.get(agent_id)
        if agent is None:  # purged between the two queries: the next read drops it
            continue
        node = summaries[agent_id]
        html = render_to_string("sessions/_tree_node_main.html", {"node": node, **forms})
        nodes.append(Node(agent_id, agent.parent_id, node["status"], html))
    return nodes


def fork_origins(agent_ids: list[str]) -> dict[str, dict]:
    """Where each forked agent came from (its first fact says), by agent id."""
    rows = Event.objects.filter(agent_id__in=agent_ids, seq=1, type="agent.spawned").values_list(
        "agent_id", "data")
    return {agent_id: data["fork"] for agent_id, data in rows if (data or {}).get("fork")}


def node_forms() -> dict:
    return {"prompt_form": TextCommandForm("prompt"), "steer_form": TextCommandForm("steer")}
