"""Idempotent commands: everything that changes an agent goes through here,
journaled first and acted on later by the worker (sessions/worker/).

    base.py     the transaction, idempotency, body checks, CommandRefused
    spawn.py    spawn, spawn_child (an agent's request), the one spawn body
    lineage.py  a child's spec: inherited from its parent, never wider than it
    quotas.py   the workspace quotas a spawn must fit (quota.*)
    agent.py    prompt, steer, interrupt, pause, resume, stop, reattach, rebridge, checkpoint
    fork.py     fork from a checkpoint or an event
    approve.py  an operator's approval, or denial, of held credentials
"""

from .agent import AGENT_VERBS, OPERATION_VERBS, TEXT_VERBS, send
from .approve import approve, deny
from .base import CommandRefused, Outcome, check_key, request_hash, wake_worker
from .fork import fork
from .spawn import spawn, spawn_child

__all__ = [
    "AGENT_VERBS", "OPERATION_VERBS", "TEXT_VERBS", "CommandRefused", "Outcome", "approve", "deny",
    "check_key", "fork", "request_hash", "send", "spawn", "spawn_child", "wake_worker",
]
