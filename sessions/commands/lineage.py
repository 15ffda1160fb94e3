"""A child is never wider than its parent (docs/SECURITY.md#children-approvals-and-quotas).

Whoever asks for a child — a model through its ``spawn`` tool (the bridge's
``request.spawn``, sessions/worker/relay.py), or a user with ``"parent"`` in
``POST /api/agents`` or a fork — gets one that can reach no more than its
parent could:

============  =============================================================
credentials   only the parent's bindings (same name and env); a ``hold``
              stays ``hold`` (an ``auto`` may become ``hold``); an
              ``inject: gateway`` stays ``gateway`` (the key stays outside)
network       ``host`` only when the parent has ``host``
limits        each of memory_mb, pids, cpus at most the parent's
tools         a subset of the parent's
run_as        the parent's user, unless the parent runs as root
hooks         the parent's hooks kept as they are (a ``pre_tool_use`` hook
              is a guard); a new hook or setup step, being a shell command,
              only when the parent has the bash tool
============  =============================================================

Free: model, image, packages (they need ``network: host`` anyway), checkpoint
and name — they choose what runs, not what it may reach.

A child's spec starts from its parent's: the fields it names replace the
parent's (``limits`` and ``hooks`` key by key), the rest are inherited, so
``{"tools": ["read"]}`` is a read-only copy of the parent.
"""

from __future__ import annotations

import copy
from typing import Any

from sessions.specs import inject_of

from .base import CommandRefused

#: Spec fields merged key by key into the parent's, not replaced whole.
MERGED = ("limits", "hooks")
ESCALATION = "spawn.escalation"


def child_spec(parent_spec: dict, raw: Any) -> Any:
    """The child's spec before validation: the parent's with `raw`'s fields
    over it. Anything but an object (None: inherit all) is returned as given
    when it is not None, so validation refuses it as it would for a root."""
    if raw is None:
        return copy.deepcopy(parent_spec)
    if not isinstance(raw, dict):
        return raw
    merged = copy.deepcopy(parent_spec)
    for key, value in raw.items():
        if key in MERGED and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def refuse_if_wider(parent_id: str, parent: dict, child: dict) -> None:
    """Raise 403 spawn.escalation naming the first field where the (normalized)
    child spec reaches further than its parent's."""
    found = widening(parent, child)
    if found is not None:
        field, why = found
        raise CommandRefused(
            403, ESCALATION,
            f"A child may not be wider than its parent {parent_id}: spec.{field} {why}. "
            "Ask for no more than the parent has "
            "(docs/SECURITY.md#children-approvals-and-quotas).", field=field)


def widening(parent: dict, child: dict) -> tuple[str, str] | None:
    """(field, why) of the first way `child` is wider than `parent`, or None. Pure."""
    for check in (_credentials, _network, _limits, _tools, _run_as, _hooks, _setup):
        found = check(parent, child)
        if found is not None:
            return found
    return None


def _credentials(parent: dict, child: dict):
    theirs = {b["name"]: b for b in parent.get("credentials") or []}
    for i, binding in enumerate(child.get("credentials") or []):
        mine = theirs.get(binding["name"])
        if mine is None:
            return (f"credentials[{i}]",
                    f"binds {binding['name']!r}, which the parent is not bound to")
        if mine["env"] != binding["env"]:
            return (f"credentials[{i}].env",
                    f"puts {binding['name']!r} in {binding['env']}, the parent in {mine['env']}")
        if inject_of(mine) == "gateway" and inject_of(binding) != "gateway":
            return (f"credentials[{i}].inject",
                    f"puts {binding['name']!r} into the sandbox; the parent's stays at the "
                    "model gateway (it stays \"gateway\")")
        if mine.get("approval") == "hold" and binding.get("approval") != "hold":
            return (f"credentials[{i}].approval",
                    f"is {binding.get('approval')!r}, but the parent holds {binding['name']!r} "
                    "for an operator's approval (it stays \"hold\")")
    return None


def _network(parent: dict, child: dict):
    if child.get("network") == "host" and parent.get("network") != "host":
        return "network", f"is \"host\", the parent's is {parent.get('network')!r}"
    return None


def _limits(parent: dict, child: dict):
    theirs = parent.get("limits") or {}
    for key, value in (child.get("limits") or {}).items():
        if key in theirs and value > theirs[key]:
            return f"limits.{key}", f"is {value}, more than the parent's {theirs[key]}"
    return None


def _tools(parent: dict, child: dict):
    theirs = set(parent.get("tools") or [])
    extra = [t for t in child.get("tools") or [] if t not in theirs]
    if extra:
        return "tools", f"adds {', '.join(extra)}, which the parent does not have"
    return None


def _run_as(parent: dict, child: dict):
    theirs = parent.get("run_as") or "root"
    if theirs != "root" and child.get("run_as") != theirs:
        return "run_as", f"is {child.get('run_as')!r}, the parent runs as {theirs!r}"
    return None


def _hooks(parent: dict, child: dict):
    theirs, mine = parent.get("hooks") or {}, child.get("hooks") or {}
    for name, command in theirs.items():
        if mine.get(name) != command:
            return f"hooks.{name}", "drops or changes the parent's hook"
    if not _has_bash(parent):
        added = sorted(set(mine) - set(theirs))
        if added:
            return f"hooks.{added[0]}", "adds a hook (a shell command) to a parent without bash"
    return None


def _setup(parent: dict, child: dict):
    if _has_bash(parent):
        return None
    theirs = parent.get("setup") or []
    for i, step in enumerate(child.get("setup") or []):
        if step not in theirs:
            return f"setup[{i}]", "adds a setup step (a shell command) to a parent without bash"
    return None


def _has_bash(spec: dict) -> bool:
    return "bash" in (spec.get("tools") or [])
