"""The checkpoint retention sweep (run by the worker's supervisor, and by
`manage.py sweep_checkpoints`).

A checkpoint goes when the first of these holds: its own `expires_at` has
passed (it never moves later); its workspace's policy, which may only be
shorter, says it is too old; the workspace keeps no data (zero data
retention); or it is beyond the workspace's newest-N for its agent. Its file
is deleted, the row keeps its metadata with `deleted_at`, and the agent's
transcript gets one `agent.checkpoint_expired` fact — nothing disappears silently.

The same sweep removes live homes past their hour (sessions/live_home.py):
looks, not checkpoints, so without a fact (their rows keep `deleted_at`).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from sandboxes import config
from sessions import journal, live_home
from sessions.models import Checkpoint, RetentionSweep, Workspace

log = logging.getLogger(__name__)


def why_expired(cp: Checkpoint, ws: Workspace, rank: int, now) -> str | None:
    """The reason `cp` must go now, or None. `rank` is 0 for the agent's newest."""
    if ws.zero_data_retention:
        return "zero_data_retention"
    if cp.expires_at <= now:
        return "expired"
    if cp.created_at + timedelta(days=ws.checkpoint_max_age_days) <= now:
        return "policy_max_age"
    if rank >= ws.keep_newest_checkpoints:
        return "beyond_newest"
    return None


def sweep(now=None) -> RetentionSweep:
    now = now or timezone.now()
    started = timezone.now()
    reasons: Counter[str] = Counter()
    for ws in Workspace.objects.all():
        live = (Checkpoint.objects.filter(agent__workspace=ws, deleted_at=None)
                .order_by("agent_id", "-created_at", "-id"))
        rank_of: Counter[str] = Counter()
        for cp in live:
            reason = why_expired(cp, ws, rank_of[cp.agent_id], now)
            rank_of[cp.agent_id] += 1
            if reason and _remove(cp, reason):
                reasons[reason] += 1
    looks = live_home.sweep(now)
    if looks:
        log.info("retention sweep removed %d expired live home(s)", looks)
    run = RetentionSweep.objects.create(started_at=started, finished_at=timezone.now(),
                                        removed=sum(reasons.values()), by_reason=dict(reasons))
    if run.removed:
        log.info("retention sweep removed %d checkpoint(s): %s", run.removed, dict(reasons))
    return run


def _remove(cp: Checkpoint, reason: str) -> bool:
    _delete_file(cp.path)
    with transaction.atomic():
        if not Checkpoint.objects.filter(pk=cp.pk, deleted_at=None).update(deleted_at=timezone.now()):
            return False  # another sweep got there first
        journal.append(cp.agent_id, "agent.checkpoint_expired",
                       {"checkpoint": cp.pk, "turn": cp.turn, "reason": reason})
    return True


def _delete_file(path: str) -> None:
    """Delete a checkpoint file, but only inside the data dir's checkpoints."""
    if not path:
        return
    root = config.data_dir().checkpoints.resolve()
    target = Path(path).resolve()
    if root in target.parents:
        target.unlink(missing_ok=True)
    else:
        log.warning("not deleting %s: outside %s", target, root)
