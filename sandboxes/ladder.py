"""The restore ladder (BRIEF §3): bring an agent whose sandbox is not answering
back, gentlest rung first. Every rung taken is ONE transcript fact,
``agent.restored {rung, reason, old_sandbox_id, new_sandbox_id}``; the last
rung is ``agent.lost {reason}``.

1. **reattach** — the sandbox runs and its bridge answers within
   :data:`REATTACH_S`: a running turn keeps running, the relay continues from
   the durable cursor. Journaled only at boot recovery (the control plane
   restarted: reason ``control_plane_restart``); a driver that merely
   reconnects says nothing.
2. **resume** — the sandbox is there but the bridge is not: started again on
   its session file (local backend: the bridge *is* the sandbox's process, so
   a dead bridge leaves it exited; docker: a running container whose bridge
   does not answer is stopped and started). The bridge settles a turn that was
   running as ``turn.interrupted {reason: bridge_restarted}`` itself.
3. **restart** — a docker container left Exited (reboot, daemon crash, the
   bridge killed under docker-init): ``start`` — its disk is intact — then
   the bridge resumes as in 2.
4. **restore** — the sandbox is missing or cannot start: a fresh sandbox from
   the setup snapshot (``sandboxes.setup.ensure_setup_image``) with the
   newest usable turn checkpoint (not deleted, not expired, file present)
   extracted safely into its home; the checkpoint's session file tells the
   relay where the restored bridge's events continue (the cursor is set to
   ``min(journaled cursor, the checkpoint's head)``, so nothing is journaled
   twice and nothing the restored bridge emits is skipped), and its turn
   counter is moved past the transcript's newest turn. Wait-for inputs are
   written again.
5. **rebuild** — no usable checkpoint (``no_checkpoint``, or
   ``checkpoint_expired`` when the newest one expired): a fresh sandbox whose
   bridge starts with ``--seed`` (the ``seed`` op at startup, so the seed is
   part of the sandbox and a crash cannot leave an unseeded bridge behind)
   holding the conversation rebuilt from the transcript.
6. **lost** — the image is gone and cannot be built, or the sandbox cannot be
   created :data:`CREATE_ATTEMPTS` times in a row: ``agent.lost {reason}``.

Interrupted turns settle exactly once: rungs 2–3 leave it to the bridge; on
rungs 4–6 the control plane reads the transcript and, if a ``turn.started``
has no settled end, journals ``tool.result {interrupted: true, exit_code:
-1}`` for each dangling tool call and ``turn.interrupted {reason:
"sandbox_lost", text}`` with the text that survived — in the same transaction
as ``agent.restored`` and re-checked inside it. (When a restored checkpoint's
session was itself mid-turn, the restored bridge settles that turn instead.)
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from sandboxes.backends.base import SandboxStatus, bridge_reachable, get_backend
from sandboxes.errors import BackendUnavailable, ImageMissing, SandboxError, SandboxNotFound
from sandboxes.fresh import (  # noqa: F401 - inputs_dir is part of the ladder's interface
    CheckpointUnusable,
    Plan,
    _build,
    _session_of,
    _write_inputs,
    inputs_dir,
)
from sandboxes.settling import (  # noqa: F401 - dangling is part of the ladder's interface
    _conversation_events,
    dangling,
    seed_conversation,
    settle_facts,
)

if TYPE_CHECKING:  # pragma: no cover
    from sandboxes.driver import AgentDriver

log = logging.getLogger(__name__)

REATTACH_S = 5.0
CONNECT_S = 15.0
CREATE_ATTEMPTS = 3


class AgentLost(Exception):
    """The ladder's last rung: agent.lost was journaled."""


class LadderError(Exception):
    """Not now (the engine does not answer, a bridge is slow): try again later."""


# --- the ladder --------------------------------------------------------------------------------


async def recover(driver: AgentDriver, *, boot: bool = False) -> None:
    """Bring ``driver.info``'s sandbox to a bridge that answers; on return
    ``driver.control`` / ``driver.events`` are connected and ``driver.info``
    holds the sandbox id and relay cursor to use. Raises AgentLost after
    journaling agent.lost, LadderError when it should be tried again later."""
    info, backend = driver.info, driver.backend
    sid = info.sandbox_id
    if not bridge_reachable(info.sandbox_host) and backend.host != get_backend().host:
        await _move_here(driver, sid)
        return
    state = await asyncio.to_thread(backend.status, sid)
    log.info("agent %s: sandbox %s is %s (boot=%s)", info.id, sid[:16], state, boot)
    if state is SandboxStatus.UNKNOWN:
        raise LadderError(f"the {backend.name} backend cannot tell the state of sandbox {sid} now")

    if state is SandboxStatus.RUNNING:
        if await driver.connect(REATTACH_S):
            if boot:
                lease = getattr(driver, "lease", None)
                why = "worker_takeover" if lease is not None and lease.expired else "control_plane_restart"
                await _journal_rung(info.id, "reattach", why, sid, sid)
            return
        state = await asyncio.to_thread(backend.status, sid)
        if state is SandboxStatus.RUNNING:
            # A bridge that does not answer in a running sandbox: start it again on its session.
            try:
                await asyncio.to_thread(backend.stop, sid, 5)
                await asyncio.to_thread(backend.start, sid)
            except SandboxNotFound:
                state = SandboxStatus.MISSING
            except SandboxError as exc:
                if not exc.permanent:
                    raise LadderError(f"cannot restart the bridge of {sid}: {exc}") from exc
                state = SandboxStatus.MISSING
            else:
                await _journal_rung(info.id, "resume", "bridge_unresponsive", sid, sid)
                await _connect_or_retry(driver, sid)
                return

    if state is SandboxStatus.EXITED:
        rung, reason = (("restart", "sandbox_exited") if backend.name == "docker"
                        else ("resume", "bridge_exited"))
        try:
            await asyncio.to_thread(backend.start, sid)
        except SandboxNotFound:
            state = SandboxStatus.MISSING
        except SandboxError as exc:
            if not exc.permanent:
                raise LadderError(f"cannot start sandbox {sid}: {exc}") from exc
            log.warning("agent %s: sandbox %s cannot start (%s): restoring", info.id, sid, exc)
            await _fresh(driver, "sandbox_cannot_start")
            return
        else:
            await _journal_rung(info.id, rung, reason, sid, sid)
            await _connect_or_retry(driver, sid)
            return

    await _fresh(driver, "sandbox_missing")


async def _move_here(driver: AgentDriver, sid: str) -> None:
    """The sandbox is on another machine's engine (its worker died): this
    worker cannot reach its bridge. Remove it there first — a run must never
    go on beside its replacement — then restore onto this worker's engine.
    An engine that does not answer may still be running it: try again later."""
    old_backend = driver.backend
    try:
        await asyncio.to_thread(old_backend.remove, sid)
    except SandboxNotFound:
        pass
    except SandboxError as exc:
        raise LadderError(f"cannot remove sandbox {sid} on {old_backend.host} before moving "
                          f"the agent here: {exc}") from exc
    log.info("agent %s: sandbox %s removed from %s; restoring here", driver.info.id, sid[:16],
             old_backend.host)
    driver.backend = get_backend()
    await _fresh(driver, "engine_unreachable_from_worker")


async def _connect_or_retry(driver: AgentDriver, sid: str) -> None:
    if not await driver.connect(CONNECT_S):
        raise LadderError(f"the bridge in sandbox {sid} did not answer after it was started")


async def _fresh(driver: AgentDriver, why: str) -> None:
    """Rungs 4-6: a fresh sandbox (restore or rebuild), else lost."""
    from sandboxes.provisioning import run_dir_for
    from sessions import approvals

    info, backend = driver.info, driver.backend
    old = info.sandbox_id
    # A fresh sandbox gets the bound secrets again: held ones need a new approval.
    if not await database_sync_to_async(approvals.ensure_approved)(info.id,
                                                                    approvals.SANDBOX_REPLACED):
        raise approvals.AwaitingApproval(
            f"sandbox {old[:16]} is gone ({why}); its replacement waits for a credential approval")
    plan = await _plan(info)
    plan.extra["cause"] = why
    failures, last_error = 0, ""
    new_sid = None
    while new_sid is None:
        try:
            new_sid = await asyncio.to_thread(_build, backend, info, run_dir_for(info.id), plan)
        except BackendUnavailable as exc:
            raise LadderError(f"cannot create a sandbox now: {exc}") from exc
        except ImageMissing as exc:
            if not await asyncio.to_thread(_rebuild_image, info.spec):
                await _lose(info, old, f"image_missing: {exc}"[:500])
            failures += 1
            last_error = str(exc)
        except CheckpointUnusable as exc:
            log.warning("agent %s: checkpoint %s unusable (%s): rebuilding", info.id,
                        plan.checkpoint, exc)
            plan = await _plan(info, skip_checkpoints=True, reason="checkpoint_unusable")
            plan.extra["cause"] = why
            continue
        except Exception as exc:  # noqa: BLE001 - counted; the third in a row is lost
            failures += 1
            last_error = f"{type(exc).__name__}: {exc}"
        if new_sid is None:
            log.warning("agent %s: creating a sandbox failed (%d/%d): %s", info.id, failures,
                        CREATE_ATTEMPTS, last_error)
            if failures >= CREATE_ATTEMPTS:
                await _lose(info, old, f"sandbox_create_failed: {last_error}"[:500])
            await asyncio.sleep(min(2.0, 0.5 * failures))
    cursor, session = info.cursor, info.session
    if plan.rung == "restore" and plan.cp_session:
        session = plan.cp_session
        cursor = min(info.cursor, plan.cp_head) if info.session == plan.cp_session else plan.cp_head
    elif plan.rung == "rebuild":
        cursor, session = 0, ""  # a new session counting from 1; adopting it is no news
    data = {"rung": plan.rung, "reason": plan.reason, "old_sandbox_id": old,
            "new_sandbox_id": new_sid, "backend": backend.name, "host": backend.host, **plan.extra}
    if plan.checkpoint:
        data["checkpoint"] = plan.checkpoint["id"]
        data["checkpoint_turn"] = plan.checkpoint["turn"]
    if plan.seed is not None:
        data["seeded_messages"] = len(plan.seed["messages"])
    try:
        await _commit_fresh(info.id, old, new_sid, data, cursor, session,
                            skip_turn=plan.cp_current_turn if plan.rung == "restore" else None)
    except BaseException:
        await asyncio.to_thread(backend.remove, new_sid)
        raise
    log.info("agent %s: %s (%s): sandbox %s → %s", info.id, plan.rung, plan.reason, old[:16],
             new_sid[:16])
    info.sandbox_id, info.cursor, info.session = new_sid, cursor, session
    await asyncio.to_thread(_write_inputs, backend, info.id, new_sid)
    await _connect_or_retry(driver, new_sid)


async def provision_fork(driver: AgentDriver, origin: dict) -> None:
    """A forked agent's first sandbox: the source's checkpoint (its disk and
    conversation through the boundary), or a fresh disk seeded with the
    source's transcript through `at_event`. Journals `agent.sandbox` and
    `agent.forked`; the driver connects afterwards."""
    from sandboxes.provisioning import run_dir_for

    info, backend = driver.info, driver.backend
    plan = await _fork_plan(origin)
    new_sid = await asyncio.to_thread(_build, backend, info, run_dir_for(info.id), plan)
    cursor, session = (plan.cp_head, plan.cp_session) if plan.rung == "restore" else (0, "")
    data = {"from": origin, "rung": plan.rung, "sandbox_id": new_sid, "host": backend.host}
    if plan.seed is not None:
        data["seeded_messages"] = len(plan.seed["messages"])
    try:
        await _commit_fork(info.id, new_sid, data, cursor, session)
    except BaseException:
        await asyncio.to_thread(backend.remove, new_sid)
        raise
    info.sandbox_id, info.cursor, info.session = new_sid, cursor, session


async def _lose(info, old: str, reason: str) -> None:
    await _commit_lost(info.id, old, reason)
    log.error("agent %s: lost (%s)", info.id, reason)
    raise AgentLost(reason)


def _rebuild_image(spec: dict) -> bool:
    """The default base image is gone: build it again (False when it cannot be)."""
    image = spec.get("image") or "default"
    if image != "default":
        return False
    try:
        from sandboxes import images

        images.ensure_base_image()
        return True
    except Exception as exc:  # noqa: BLE001
        log.error("the base image cannot be built: %s", exc)
        return False


@database_sync_to_async
def _plan(info, *, skip_checkpoints: bool = False, reason: str | None = None) -> Plan:
    from sessions.models import Checkpoint

    events = _conversation_events(info.id)
    max_turn = max((int((e["data"] or {}).get("turn") or 0) for e in events
                    if e["type"] == "turn.started"), default=0)
    if not skip_checkpoints and not info.zero_retention:
        now = timezone.now()
        rows = list(Checkpoint.objects.filter(agent_id=info.id, deleted_at__isnull=True)
                    .order_by("-created_at", "-id")[:20])
        newest_expired = bool(rows) and rows[0].expires_at <= now
        for row in rows:
            if row.expires_at <= now or not row.path or not Path(row.path).is_file():
                continue
            session = _session_of(row.path) or {}
            current = session.get("current") or None
            plan = Plan("restore", "sandbox_missing", {"id": row.pk, "path": row.path,
                                                       "turn": row.turn},
                        max_turn=max_turn, cp_session=str(session.get("session_id") or ""),
                        cp_head=int(session.get("bseq") or 0),
                        cp_current_turn=(current or {}).get("turn") if current else None)
            return plan
        if newest_expired:
            reason = reason or "checkpoint_expired"
    # Rebuild: the transcript's conversation, with the dangling turn settled as it will be.
    settled = events + [{"type": t, "data": d} for t, d in settle_facts(events)]
    return Plan("rebuild", reason or "no_checkpoint", seed=seed_conversation(settled),
                max_turn=max_turn)


@database_sync_to_async
def _commit_fresh(agent_id: str, old: str, new: str, data: dict, cursor: int, session: str,
                  skip_turn: int | None) -> None:
    from sessions import approvals, journal
    from sessions.models import Agent

    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, sandbox_id=old).update(
            bridge_cursor=cursor, bridge_session=session)
        if moved != 1:
            raise LadderError(f"agent {agent_id}: its sandbox is no longer {old}")
        facts = settle_facts(_conversation_events(agent_id), skip_turn=skip_turn)
        back = approvals.status_after_replacement(agent_id)
        if back is not None:  # "restoring, waiting for approval" ends here
            facts.insert(0, back)
        facts.append(("agent.sandbox", {"sandbox_id": new, "backend": data.get("backend"),
                                        "host": data.get("host"),
                                        "rung": data["rung"]}))
        facts.append(("agent.restored", data))
        requeued = _requeue_unstarted_prompts(agent_id)
        if requeued:
            facts.append(("command.requeued", {"commands": requeued, "reason": "sandbox_replaced"}))
        journal.append_many(agent_id, facts)


def _requeue_unstarted_prompts(agent_id: str) -> list[int]:
    """Prompts the lost bridge had accepted (their Command is done) but never
    started a turn for were queued in the sandbox that is gone: make them
    pending again so the driver sends them to the new bridge. The bridge
    dedups by command id, so one a restored checkpoint still queues runs once."""
    from sessions.models import Command, Event

    started = {str((d or {}).get("command_id")) for d in Event.objects.filter(
        agent_id=agent_id, type="turn.started").values_list("data", flat=True)}
    waiting = [pk for pk in Command.objects.filter(agent_id=agent_id, verb="prompt", state="done")
               .order_by("id").values_list("pk", flat=True) if str(pk) not in started]
    Command.objects.filter(pk__in=waiting).update(state="pending", acted_at=None)
    return waiting


@database_sync_to_async
def _fork_plan(origin: dict) -> Plan:
    from sessions.models import Checkpoint

    source = origin["agent"]
    if origin.get("checkpoint"):
        row = Checkpoint.objects.get(pk=origin["checkpoint"], agent_id=source)
        session = _session_of(row.path) or {}
        return Plan("restore", "fork", {"id": row.pk, "path": row.path, "turn": row.turn},
                    max_turn=row.turn, cp_session=str(session.get("session_id") or ""),
                    cp_head=int(session.get("bseq") or 0))
    through = int(origin["at_event"])
    events = [e for e in _conversation_events(source, through=through)]
    settled = events + [{"type": t, "data": d} for t, d in settle_facts(events, reason="forked")]
    max_turn = max((int((e["data"] or {}).get("turn") or 0) for e in events
                    if e["type"] == "turn.started"), default=0)
    return Plan("rebuild", "fork", seed=seed_conversation(settled), max_turn=max_turn)


@database_sync_to_async
def _commit_fork(agent_id: str, sid: str, data: dict, cursor: int, session: str) -> None:
    from sessions import journal
    from sessions.models import Agent

    with transaction.atomic():
        status = Agent.objects.filter(pk=agent_id, sandbox_id="").values_list("status", flat=True).first()
        if status is None:
            raise LadderError(f"agent {agent_id} already has a sandbox")
        Agent.objects.filter(pk=agent_id).update(bridge_cursor=cursor, bridge_session=session)
        facts = [("agent.sandbox", {"sandbox_id": sid, "rung": data["rung"], "host": data.get("host")}),
                 ("agent.forked", data)]
        if status == "starting":
            facts.append(("agent.status", {"status": "idle", "reason": "forked"}))
        journal.append_many(agent_id, facts)


@database_sync_to_async
def _commit_lost(agent_id: str, old: str, reason: str) -> None:
    from sessions import journal

    with transaction.atomic():
        facts = settle_facts(_conversation_events(agent_id))
        facts.append(("agent.lost", {"reason": reason, "old_sandbox_id": old}))
        # Prompts queued in the lost bridge become pending again, so the driver
        # fails them visibly (command.failed) instead of their vanishing.
        requeued = _requeue_unstarted_prompts(agent_id)
        if requeued:
            facts.append(("command.requeued", {"commands": requeued, "reason": "agent_lost"}))
        journal.append_many(agent_id, facts)


@database_sync_to_async
def _journal_rung(agent_id: str, rung: str, reason: str, old: str, new: str) -> None:
    from sessions import journal

    journal.append(agent_id, "agent.restored", {"rung": rung, "reason": reason,
                                                "old_sandbox_id": old, "new_sandbox_id": new})
