"""The restore ladder: bring an agent whose sandbox is not answering back,
gentlest rung first. Every rung taken is ONE transcript fact,
``agent.restored {rung, reason, old_sandbox_id, new_sandbox_id}``; the last
rung is ``agent.lost {reason}``.

1. **reattach** — the sandbox runs and its bridge answers within
   :data:`REATTACH_S`: a running turn keeps running, the relay continues from
   the durable cursor. Journaled only at boot recovery (the control plane
   restarted: reason ``control_plane_restart``, or ``worker_takeover``); a
   driver that merely reconnects says nothing.
2. **resume** — the sandbox is there but the bridge is not: started again on
   its session file (a backend whose bridge *is* the sandbox's process leaves
   it exited when the bridge dies; a running sandbox whose bridge does not
   answer is stopped and started). The bridge settles a turn that was running
   as ``turn.interrupted {reason: bridge_restarted}`` itself.
3. **restart** — a sandbox left exited that ``restarts_in_place`` (a reboot, a
   daemon crash): ``start`` — its disk is intact — then the bridge resumes as in 2.
   Also a sandbox whose backend gives a ``restart_reason`` (one made with
   another isolation, e.g. by the unisolated backend before an upgrade):
   stopped, started under this backend's isolation, reason journaled.
4. **restore** — the sandbox is missing or cannot start: a fresh sandbox from
   the setup snapshot with the newest usable turn checkpoint extracted safely
   into its home (sessions/worker/plans.py); the checkpoint's session file
   tells the relay where the restored bridge's events continue (the journaled
   cursor, in the checkpoint's session; when the lost bridge had got past the
   checkpoint, the restored one numbers its events after that cursor: no
   number is journaled twice and nothing it emits is skipped), and its
   turn counter is moved past the transcript's newest turn. Wait-for inputs
   are written again.
5. **rebuild** — no usable checkpoint (the reason says what became of the
   newest one: sessions/worker/plans.py REBUILD_REASONS): a fresh sandbox whose
   bridge starts with ``--seed`` holding the conversation rebuilt from the
   transcript (the seed is part of the sandbox, so a crash cannot leave an
   unseeded bridge behind).
6. **lost** — the image is gone and cannot be built, or the sandbox cannot be
   created :data:`CREATE_ATTEMPTS` times in a row: ``agent.lost {reason}``.

Interrupted turns settle exactly once: rungs 2–3 leave it to the bridge; on
rungs 4–6 the control plane reads the transcript and, if a ``turn.started``
has no settled end, journals ``tool.result {interrupted: true, exit_code:
-1}`` for each dangling tool call and ``turn.interrupted {reason:
"sandbox_lost", text}`` with the text that survived — in the same transaction
as ``agent.restored`` and re-checked inside it. (When a restored checkpoint's
session was itself mid-turn, the restored bridge settles that turn instead.)

The ladder connects the driver's :class:`BridgeLink` and returns a
:class:`Recovered`; it never changes the driver.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from channels.db import database_sync_to_async
from django.db import transaction

from sandboxes import images, launch
from sandboxes.backends import bridge_reachable, get_backend
from sandboxes.backends.base import SandboxBackend, SandboxStatus
from sandboxes.errors import BackendUnavailable, ImageMissing, SandboxError, SandboxNotFound
from sandboxes.launch import CheckpointUnusable
from sessions import approvals, journal
from sessions.models import Agent, Command, CommandState, Event

from . import plans
from .context import AgentInfo, AgentLost, AwaitingApproval, LadderError
from .link import BridgeLink
from .settling import conversation_events, settle_facts

log = logging.getLogger(__name__)

REATTACH_S = 5.0
CONNECT_S = 15.0
CREATE_ATTEMPTS = 3


@dataclass(frozen=True)
class Recovered:
    """Where the agent's bridge answers now, and where its relay continues."""

    backend: SandboxBackend
    sandbox_id: str
    cursor: int
    session: str


# --- the ladder --------------------------------------------------------------------------------


async def recover(info: AgentInfo, backend: SandboxBackend, link: BridgeLink, *,
                  boot: bool = False, takeover: bool = False) -> Recovered:
    """Bring ``info``'s sandbox to a bridge that answers; on return ``link``
    is connected. ``takeover``: this worker took the agent over from a worker
    whose lease expired. Raises AgentLost after journaling agent.lost,
    LadderError when it should be tried again later."""
    sid = info.sandbox_id
    here = Recovered(backend, sid, info.cursor, info.session)
    if not bridge_reachable(info.sandbox_host) and backend.host != get_backend().host:
        return await _move_here(info, backend, link)
    state = await asyncio.to_thread(backend.status, sid)
    log.info("agent %s: sandbox %s is %s (boot=%s)", info.id, sid[:16], state, boot)
    if state is SandboxStatus.UNKNOWN:
        raise LadderError(f"the {backend.name} backend cannot tell the state of sandbox {sid} now")
    if state is not SandboxStatus.MISSING:
        why = await asyncio.to_thread(backend.restart_reason, sid)
        if why:
            return await _restart_in_place(info, backend, link, state, why, here)
    if state is SandboxStatus.RUNNING:
        state = await _reattach_or_resume(info, backend, link, boot=boot, takeover=takeover)
        if state is None:
            return here
    if state is SandboxStatus.EXITED:
        try:
            await asyncio.to_thread(backend.start, sid)
        except SandboxNotFound:
            state = SandboxStatus.MISSING
        except SandboxError as exc:
            if not exc.permanent:
                raise LadderError(f"cannot start sandbox {sid}: {exc}") from exc
            log.warning("agent %s: sandbox %s cannot start (%s): restoring", info.id, sid, exc)
            return await _fresh(info, backend, link, "sandbox_cannot_start")
        else:
            rung, reason = (("restart", "sandbox_exited") if backend.restarts_in_place
                            else ("resume", "bridge_exited"))
            await _journal_rung(info.id, rung, reason, sid, sid)
            await _connect_or_retry(link, sid)
            return here
    return await _fresh(info, backend, link, "sandbox_missing")


async def _reattach_or_resume(info: AgentInfo, backend: SandboxBackend, link: BridgeLink, *,
                              boot: bool, takeover: bool) -> SandboxStatus | None:
    """Rungs 1–2 on a running sandbox: None once the bridge answers, else the
    sandbox's state for the rungs below."""
    sid = info.sandbox_id
    if await link.connect(REATTACH_S):
        if boot:
            why = "worker_takeover" if takeover else "control_plane_restart"
            await _journal_rung(info.id, "reattach", why, sid, sid)
        return None
    state = await asyncio.to_thread(backend.status, sid)
    if state is not SandboxStatus.RUNNING:
        return state
    # A bridge that does not answer in a running sandbox: start it again on its session.
    try:
        await asyncio.to_thread(backend.stop, sid, 5)
        await asyncio.to_thread(backend.start, sid)
    except SandboxNotFound:
        return SandboxStatus.MISSING
    except SandboxError as exc:
        if not exc.permanent:
            raise LadderError(f"cannot restart the bridge of {sid}: {exc}") from exc
        return SandboxStatus.MISSING
    await _journal_rung(info.id, "resume", "bridge_unresponsive", sid, sid)
    await _connect_or_retry(link, sid)
    return None


async def _restart_in_place(info: AgentInfo, backend: SandboxBackend, link: BridgeLink,
                            state: SandboxStatus, why: str, here: Recovered) -> Recovered:
    """A sandbox the backend must restart before it is used (made with another
    isolation: an upgrade moves a local sandbox into bubblewrap): stopped if it
    runs, started again with its disk, journaled as a restart with the reason;
    the bridge resumes its session and settles a running turn itself."""
    sid = info.sandbox_id
    log.warning("agent %s: sandbox %s is restarted in place (%s)", info.id, sid[:16], why)
    try:
        if state is SandboxStatus.RUNNING:
            await asyncio.to_thread(backend.stop, sid, 5)
        await asyncio.to_thread(backend.start, sid)
    except SandboxNotFound:
        return await _fresh(info, backend, link, "sandbox_missing")
    except SandboxError as exc:
        if not exc.permanent:
            raise LadderError(f"cannot restart sandbox {sid} in place: {exc}") from exc
        log.warning("agent %s: sandbox %s cannot start (%s): restoring", info.id, sid, exc)
        return await _fresh(info, backend, link, "sandbox_cannot_start")
    await _journal_rung(info.id, "restart", why, sid, sid)
    await _connect_or_retry(link, sid)
    return here


async def _move_here(info: AgentInfo, old_backend: SandboxBackend, link: BridgeLink) -> Recovered:
    """The sandbox is on another machine's engine (its worker died): this
    worker cannot reach its bridge. Remove it there first — a run must never
    go on beside its replacement — then restore onto this worker's engine.
    An engine that does not answer may still be running it: try again later."""
    sid = info.sandbox_id
    try:
        await asyncio.to_thread(old_backend.remove, sid)
    except SandboxNotFound:
        pass
    except SandboxError as exc:
        raise LadderError(f"cannot remove sandbox {sid} on {old_backend.host} before moving "
                          f"the agent here: {exc}") from exc
    log.info("agent %s: sandbox %s removed from %s; restoring here", info.id, sid[:16],
             old_backend.host)
    return await _fresh(info, get_backend(), link, "engine_unreachable_from_worker")


async def _connect_or_retry(link: BridgeLink, sid: str) -> None:
    if not await link.connect(CONNECT_S):
        raise LadderError(f"the bridge in sandbox {sid} did not answer after it was started")


# --- rungs 4-6: a fresh sandbox ------------------------------------------------------------------


async def _fresh(info: AgentInfo, backend: SandboxBackend, link: BridgeLink, why: str) -> Recovered:
    """Restore or rebuild into a fresh sandbox, else lost."""
    old = info.sandbox_id
    # A fresh sandbox gets the bound secrets again: held ones need a new approval.
    if not await database_sync_to_async(approvals.ensure_approved)(info.id,
                                                                    approvals.SANDBOX_REPLACED):
        denied = await database_sync_to_async(approvals.denial)(info.id)
        if denied:
            await lose(info, denied)  # an operator refused the credentials it needs
        raise AwaitingApproval(
            f"sandbox {old[:16]} is gone ({why}); its replacement waits for a credential approval")
    plan, new_sid = await _build_with_fallbacks(info, backend, why)
    cursor, session = _cursor_after(info, plan)
    data = _restored_fact(plan, old, new_sid, backend)
    try:
        await _commit_fresh(info.id, old, new_sid, data, cursor, session,
                            skip_turn=plan.cp_current_turn if plan.rung == "restore" else None)
    except BaseException:
        await asyncio.to_thread(backend.remove, new_sid)
        raise
    log.info("agent %s: %s (%s): sandbox %s → %s", info.id, plan.rung, plan.reason, old[:16],
             new_sid[:16])
    await asyncio.to_thread(launch.write_inputs, backend, info.id, new_sid)
    await _connect_or_retry(link, new_sid)
    return Recovered(backend, new_sid, cursor, session)


async def _build_with_fallbacks(info: AgentInfo, backend: SandboxBackend,
                                why: str) -> tuple[plans.Plan, str]:
    """Build the plan's sandbox: an unusable checkpoint falls back to rebuild;
    a missing base image is built again; :data:`CREATE_ATTEMPTS` failures in a
    row lose the agent."""
    plan = await plans.for_recovery(info)
    plan.extra["cause"] = why
    failures = 0
    while True:
        try:
            return plan, await asyncio.to_thread(launch.build_fresh, backend, info.launch, plan.fresh)
        except BackendUnavailable as exc:
            raise LadderError(f"cannot create a sandbox now: {exc}") from exc
        except CheckpointUnusable as exc:
            log.warning("agent %s: checkpoint %s unusable (%s): rebuilding", info.id,
                        plan.checkpoint, exc)
            plan = await plans.for_recovery(info, skip_checkpoints=True, reason="checkpoint_unusable")
            plan.extra.update(cause=why, refused=str(exc)[:500])  # e.g. the restore size cap
            continue
        except ImageMissing as exc:
            if not await asyncio.to_thread(_rebuild_image, info.spec):
                await lose(info, f"image_missing: {exc}"[:500])
            last_error = str(exc)
        except Exception as exc:  # noqa: BLE001 - counted; the third in a row is lost
            last_error = f"{type(exc).__name__}: {exc}"
        failures += 1
        log.warning("agent %s: creating a sandbox failed (%d/%d): %s", info.id, failures,
                    CREATE_ATTEMPTS, last_error)
        if failures >= CREATE_ATTEMPTS:
            await lose(info, f"sandbox_create_failed: {last_error}"[:500])
        await asyncio.sleep(min(2.0, 0.5 * failures))


def _cursor_after(info: AgentInfo, plan: plans.Plan) -> tuple[int, str]:
    """Where the relay continues in the fresh sandbox's bridge session."""
    if plan.rung == "restore" and plan.cp_session:
        if info.session == plan.cp_session:
            # Behind the checkpoint: its bridge serves the rest from its outbox;
            # past it: its numbering was moved past the cursor (plans.bseq_floor).
            return info.cursor, plan.cp_session
        return plan.cp_head, plan.cp_session
    if plan.rung == "rebuild":
        return 0, ""  # a new session counting from 1; adopting it is no news
    return info.cursor, info.session


def _restored_fact(plan: plans.Plan, old: str, new_sid: str, backend: SandboxBackend) -> dict:
    data = {"rung": plan.rung, "reason": plan.reason, "old_sandbox_id": old,
            "new_sandbox_id": new_sid, "backend": backend.name, "host": backend.host, **plan.extra}
    if plan.checkpoint:
        data["checkpoint"] = plan.checkpoint["id"]
        data["checkpoint_turn"] = plan.checkpoint["turn"]
    if plan.seed is not None:
        data["seeded_messages"] = len(plan.seed["messages"])
    return data


async def provision_fork(info: AgentInfo, backend: SandboxBackend, origin: dict) -> Recovered:
    """A forked agent's first sandbox: the source's checkpoint (its disk and
    conversation through the boundary), or a fresh disk seeded with the
    source's transcript through `at_event`. Journals `agent.sandbox` and
    `agent.forked`; the driver connects afterwards."""
    plan = await plans.for_fork(origin)
    new_sid = await asyncio.to_thread(launch.build_fresh, backend, info.launch, plan.fresh)
    cursor, session = (plan.cp_head, plan.cp_session) if plan.rung == "restore" else (0, "")
    data = {"from": origin, "rung": plan.rung, "sandbox_id": new_sid, "host": backend.host}
    if plan.seed is not None:
        data["seeded_messages"] = len(plan.seed["messages"])
    try:
        await _commit_fork(info.id, new_sid, data, cursor, session)
    except BaseException:
        await asyncio.to_thread(backend.remove, new_sid)
        raise
    return Recovered(backend, new_sid, cursor, session)


async def lose(info: AgentInfo, reason: str) -> None:
    """The last rung: journal agent.lost (settling a dangling turn) and raise AgentLost."""
    await _commit_lost(info.id, info.sandbox_id, reason)
    log.error("agent %s: lost (%s)", info.id, reason)
    raise AgentLost(reason)


def _rebuild_image(spec: dict) -> bool:
    """The default base image is gone: build it again (False when it cannot be)."""
    if (spec.get("image") or images.DEFAULT_IMAGE) != images.DEFAULT_IMAGE:
        return False
    try:
        images.ensure_base_image()
        return True
    except Exception as exc:  # noqa: BLE001
        log.error("the base image cannot be built: %s", exc)
        return False


# --- the transactions --------------------------------------------------------------------------


@database_sync_to_async
def _commit_fresh(agent_id: str, old: str, new: str, data: dict, cursor: int, session: str,
                  skip_turn: int | None) -> None:
    with transaction.atomic():
        moved = Agent.objects.filter(pk=agent_id, sandbox_id=old).update(
            bridge_cursor=cursor, bridge_session=session)
        if moved != 1:
            raise LadderError(f"agent {agent_id}: its sandbox is no longer {old}")
        facts = settle_facts(conversation_events(agent_id), skip_turn=skip_turn)
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
    started = {str((d or {}).get("command_id")) for d in Event.objects.filter(
        agent_id=agent_id, type="turn.started").values_list("data", flat=True)}
    waiting = [pk for pk in Command.objects.filter(agent_id=agent_id, verb="prompt",
                                                   state=CommandState.DONE)
               .order_by("id").values_list("pk", flat=True) if str(pk) not in started]
    Command.objects.filter(pk__in=waiting).update(state=CommandState.PENDING, acted_at=None)
    return waiting


@database_sync_to_async
def _commit_fork(agent_id: str, sid: str, data: dict, cursor: int, session: str) -> None:
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
    with transaction.atomic():
        facts = settle_facts(conversation_events(agent_id))
        facts.append(("agent.lost", {"reason": reason, "old_sandbox_id": old}))
        # Prompts queued in the lost bridge become pending again, so the driver
        # fails them visibly (command.failed) instead of their vanishing.
        requeued = _requeue_unstarted_prompts(agent_id)
        if requeued:
            facts.append(("command.requeued", {"commands": requeued, "reason": "agent_lost"}))
        journal.append_many(agent_id, facts)


@database_sync_to_async
def _journal_rung(agent_id: str, rung: str, reason: str, old: str, new: str) -> None:
    journal.append(agent_id, "agent.restored", {"rung": rung, "reason": reason,
                                                "old_sandbox_id": old, "new_sandbox_id": new})
