"""The workspace quotas a spawn must fit (docs/SECURITY.md#children-approvals-and-quotas): live
agents, tree depth and the largest spec limits. Each refusal is a
CommandRefused with a ``quota.*`` code, the quota's field name and how to
raise it; the spawn's transaction then writes nothing.

Concurrent sandboxes are not checked here: an agent beyond that quota is
spawned and waits for a slot in the worker (sessions/worker/slots.py). Open
streams are counted by the stream itself (sessions/api/stream.py).
"""

from __future__ import annotations

from sessions.models import ENDED, Agent, Workspace

from .base import CommandRefused

#: spec limit → the Workspace field that caps it.
LIMIT_FIELDS = {"memory_mb": "max_memory_mb", "pids": "max_pids", "cpus": "max_cpus"}


def how_to_raise(workspace: Workspace, field: str) -> str:
    label = Workspace._meta.get_field(field).verbose_name
    return (f"An admin raises it in the admin: Workspaces → {workspace.name} → Quotas → "
            f"\"{label}\" ({field}).")


def locked_workspace(workspace_id: int) -> Workspace:
    """The workspace row, locked for the spawn's transaction: two spawns in one
    workspace count one after the other (PostgreSQL; SQLite's IMMEDIATE
    transaction already serializes them). Taken after any agent lock, so the
    lock order is always agent, then workspace (sessions/worker/slots.py too)."""
    return Workspace.objects.select_for_update().get(pk=workspace_id)


def check_spawn(workspace: Workspace, parent: Agent | None, spec: dict,
                named_limits: set[str]) -> dict:
    """Refuse a spawn beyond the workspace's quotas; return `spec` with every
    limit it did not name (`named_limits`) lowered to the workspace's cap, so
    `{"model": "demo"}` still fits a workspace capped below the defaults."""
    live = Agent.objects.filter(workspace=workspace).exclude(status__in=ENDED).count()
    if live >= workspace.max_agents:
        raise CommandRefused(
            429, "quota.agents",
            f"Workspace {workspace.name!r} has {live} live agents, its quota of "
            f"{workspace.max_agents}. Stop an agent first. {how_to_raise(workspace, 'max_agents')}",
            quota="max_agents", limit=workspace.max_agents, in_use=live)
    depth = 1 if parent is None else depth_of(parent, workspace.max_depth) + 1
    if depth > workspace.max_depth:
        raise CommandRefused(
            409, "quota.depth",
            f"A child of {parent.id} would be at depth {depth} of the agent tree; workspace "
            f"{workspace.name!r} allows {workspace.max_depth} (a root agent is at depth 1). "
            f"{how_to_raise(workspace, 'max_depth')}",
            quota="max_depth", limit=workspace.max_depth)
    return capped_limits(workspace, spec, named_limits)


def capped_limits(workspace: Workspace, spec: dict, named: set[str]) -> dict:
    limits = dict(spec.get("limits") or {})
    lowered = False
    for key, field in LIMIT_FIELDS.items():
        cap = getattr(workspace, field)
        if key not in limits or limits[key] <= cap:
            continue
        if key not in named:
            limits[key], lowered = cap, True
            continue
        raise CommandRefused(
            400, "quota.limits",
            f"spec.limits.{key} is {limits[key]}; workspace {workspace.name!r} allows at most "
            f"{cap}. {how_to_raise(workspace, field)}",
            quota=field, limit=cap, field=f"limits.{key}")
    return {**spec, "limits": limits} if lowered else spec


def depth_of(agent: Agent, stop_after: int) -> int:
    """The agent's depth (a root is 1), read up its parents; the walk stops
    once it passes `stop_after`, so a deep legacy tree costs no more."""
    depth, parent_id = 1, agent.parent_id
    while parent_id is not None and depth <= stop_after:
        depth += 1
        parent_id = Agent.objects.filter(pk=parent_id).values_list("parent_id", flat=True).first()
    return depth
