"""The journal of a sandbox session: facts numbered seq = 1, 2, 3 … with no
gaps, the only writer of :class:`SandboxSessionEvent` rows, and the pure fold
that says what a resume replays (:func:`replay_plan`).

Like an agent's transcript (sessions/journal.py), a fact and the session
row's projection (status, sandbox id, slot) are written in ONE transaction
under the session row's lock, so the row never disagrees with its journal.
A worker's write names the lease it holds (``holder``): a worker that lost the
session's lease cannot journal (:class:`LeaseLost`).

Facts (docs/API.md "Sandbox sessions"):

    session.created {spec, name, by, command}      command.exec|checkpoint|resume|remove
    session.sandbox {sandbox_id, backend, host, image, command}
    exec.started {command, argv, cwd}              exec.finished {…, exit_code, duration_ms,
    exec.interrupted / exec.timed_out (never replayed)        stdout, stderr, truncated}
    snapshot.taken {name, ref, command, ms}        session.lost {reason, sandbox_id}
    session.resuming {snapshot, old_sandbox_id, replay, not_replayed, command}
    exec.replayed {of_seq, argv, cwd, recorded_exit_code, exit_code}
    session.resumed {replayed, not_replayed}       session.replay_diverged {of_seq, index, …}
    session.failed {code, message}                 session.removed {command}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from sessions import wakeups
from sessions.journal import Page
from sessions.models import SandboxSession, SandboxSessionEvent

#: Facts whose exec a resume replays (argv, cwd, exit code).
RECORDED = "exec.finished"
#: Facts of execs that ran (or may have) but whose outcome was not recorded: never replayed.
UNRECORDED = ("exec.interrupted", "exec.timed_out")


class LeaseLost(Exception):
    """This worker no longer holds the sandbox session's lease: stop acting on it."""

    permanent = True


def append(session_id: str, etype: str, data: dict | None = None, *, holder: str | None = None,
           **changes: Any) -> int:
    """Append one fact and apply ``changes`` to the session row; returns its seq.
    Joins the caller's transaction when there is one."""
    with transaction.atomic():
        rows = SandboxSession.objects.select_for_update().filter(pk=session_id)
        if holder is not None:
            rows = rows.filter(lease_holder=holder)
        row = rows.only("last_seq").first()
        if row is None:
            raise LeaseLost(f"sandbox session {session_id}: this worker no longer holds its lease")
        seq = row.last_seq + 1
        SandboxSession.objects.filter(pk=session_id).update(last_seq=seq, **changes)
        SandboxSessionEvent.objects.create(session_id=session_id, seq=seq, type=etype,
                                           data=data or {}, ts=timezone.now())
        # Open streams (sessions/api/stream.py SandboxSessionStream) re-read once committed.
        transaction.on_commit(lambda: wakeups.notify([session_id]))
        return seq


def page_after(session_id: str, after: int, limit: int) -> Page:
    rows = list(SandboxSessionEvent.objects.filter(session_id=session_id, seq__gt=after)
                .order_by("seq")[: limit + 1])
    return Page(rows[:limit], len(rows) > limit, _head(session_id))


def page_before(session_id: str, before: int, limit: int) -> Page:
    rows = list(SandboxSessionEvent.objects.filter(session_id=session_id, seq__lt=before)
                .order_by("-seq")[: limit + 1])
    return Page(list(reversed(rows[:limit])), len(rows) > limit, _head(session_id))


def _head(session_id: str) -> int:
    rows = SandboxSession.objects.filter(pk=session_id)
    return rows.values_list("last_seq", flat=True).first() or 0


def facts_of(session_id: str, types: tuple[str, ...] | None = None, after: int = 0) -> list:
    rows = SandboxSessionEvent.objects.filter(session_id=session_id, seq__gt=after)
    if types is not None:
        rows = rows.filter(type__in=types)
    return list(rows.order_by("seq"))


def snapshots(session_id: str) -> list[dict]:
    """[{"name", "ref", "seq", "ts"}] of the snapshots taken, oldest first."""
    return [{"name": e.data.get("name"), "ref": e.data.get("ref"), "seq": e.seq,
             "ts": e.as_dict()["ts"]} for e in facts_of(session_id, ("snapshot.taken",))]


# --- what a resume replays -------------------------------------------------------------------


@dataclass
class Plan:
    """What a resume starts from and replays: the newest snapshot (None: the
    session's image), the execs recorded after it (in order), and the execs
    after it that ran without a recorded outcome (reported, never replayed)."""

    snapshot: dict | None = None
    execs: list[dict] = field(default_factory=list)
    not_replayed: list[dict] = field(default_factory=list)


def replay_plan(facts) -> Plan:
    """Fold a session's facts (oldest first) into its :class:`Plan`. Pure.

    A snapshot starts over. A divergence (a replayed exec exited otherwise
    than recorded) keeps what the sandbox now holds: the execs before it, the
    diverging one with the exit code it had, and drops the ones after it."""
    plan = Plan()
    for fact in facts:
        data = fact.data
        if fact.type == "snapshot.taken":
            plan = Plan(snapshot={"name": data.get("name"), "ref": data.get("ref"),
                                  "seq": fact.seq})
        elif fact.type == RECORDED:
            plan.execs.append({"seq": fact.seq, "argv": data.get("argv"), "cwd": data.get("cwd"),
                               "exit_code": data.get("exit_code"),
                               "timeout": data.get("timeout")})
        elif fact.type in UNRECORDED:
            plan.not_replayed.append({"seq": fact.seq, "command": data.get("command"),
                                      "argv": data.get("argv"), "reason": fact.type})
        elif fact.type == "session.replay_diverged":
            index = int(data.get("index", 0))
            plan.execs = plan.execs[: index + 1]
            if plan.execs:
                plan.execs[-1] = {**plan.execs[-1], "exit_code": data.get("exit_code")}
    return plan


def plan_of(session_id: str) -> Plan:
    """The session's plan, read from its newest snapshot on (not the whole journal)."""
    newest = (SandboxSessionEvent.objects.filter(session_id=session_id, type="snapshot.taken")
              .aggregate(m=Max("seq"))["m"])
    return replay_plan(facts_of(session_id, after=(newest - 1) if newest else 0))
