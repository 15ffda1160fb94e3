"""sessions/worker/plans.py: a fresh sandbox restores the newest usable
checkpoint; when there is none, the rebuild's reason says what became of the
agent's newest one — from the rows a sweep leaves and the facts that removed
them — and the dashboard says it in plain words."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from datetime import timedelta
from pathlib import Path

import pytest
import zstandard
from django.utils import timezone

from sandboxes import archive

from sessions import journal
from sessions.models import Checkpoint
from sessions.templatetags.alineo import restore_sentence
from sessions.worker import plans
from sessions.worker.context import AgentInfo

pytestmark = pytest.mark.django_db(transaction=True)


def _info(agent, *, zero_retention=False, max_age_days=30) -> AgentInfo:
    return AgentInfo(agent.id, {"model": "demo", "checkpoint": True}, "idle", "sb1", 0, "",
                     zero_retention, max_age_days, 3)


def _archive(path, session: dict | None) -> None:
    """A turn checkpoint as a bridge's home makes it: a zstd tar, with its session file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        notes = tarfile.TarInfo("./notes.txt")
        notes.size = 2
        tar.addfile(notes, io.BytesIO(b"hi"))
        if session is not None:
            payload = json.dumps(session).encode()
            member = tarfile.TarInfo("./" + archive.SESSION_MEMBER)
            member.size = len(payload)
            tar.addfile(member, io.BytesIO(payload))
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))


SESSION = {"version": 1, "session_id": "s1", "bseq": 9, "turns": 1, "current": None}


def _checkpoint(agent, tmp_path, turn=1, *, days_old=0, expires_in=30, deleted=False,
                file=True, session=SESSION) -> Checkpoint:
    path = tmp_path / f"sb1-turn-{turn}.tar.zst"
    if file:
        _archive(path, session)
    now = timezone.now()
    cp = Checkpoint.objects.create(
        agent=agent, sandbox_id="sb1", turn=turn, through_seq=turn, path=str(path),
        expires_at=now + timedelta(days=expires_in), deleted_at=now if deleted else None)
    Checkpoint.objects.filter(pk=cp.pk).update(created_at=now - timedelta(days=days_old, seconds=-turn))
    return cp


def _plan(info, **kw) -> plans.Plan:
    return asyncio.run(plans.for_recovery(info, **kw))


def test_no_checkpoint_only_when_it_never_had_one(agent):
    assert (_plan(_info(agent)).rung, _plan(_info(agent)).reason) == ("rebuild", "no_checkpoint")


def test_the_newest_usable_checkpoint_is_restored(agent, tmp_path):
    _checkpoint(agent, tmp_path, 1)
    newest = _checkpoint(agent, tmp_path, 2)
    plan = _plan(_info(agent))
    assert (plan.rung, plan.checkpoint["id"]) == ("restore", newest.pk)


@pytest.mark.parametrize("fate, reason", [
    ("expired_unswept", "checkpoint_expired"),
    ("past_a_shortened_policy", "checkpoint_expired"),
    ("swept_expired", "checkpoint_expired"),
    ("swept_by_policy", "checkpoint_expired"),
    ("swept_zero_retention", "zero_data_retention"),
    ("deleted_by_operator", "checkpoint_deleted"),
    ("deleted_without_a_fact", "checkpoint_deleted"),
    ("file_gone", "checkpoint_missing"),
])
def test_the_newest_checkpoints_fate_is_the_reason(agent, tmp_path, fate, reason):
    info = _info(agent, max_age_days=2 if fate == "past_a_shortened_policy" else 30)
    gone = fate.startswith(("swept", "deleted"))
    cp = _checkpoint(agent, tmp_path, 1, expires_in=-1 if fate == "expired_unswept" else 30,
                     days_old=3 if fate == "past_a_shortened_policy" else 0, deleted=gone,
                     file=not gone and fate != "file_gone")
    if fate.startswith("swept"):
        why = {"swept_expired": "expired", "swept_by_policy": "policy_max_age",
               "swept_zero_retention": "zero_data_retention"}[fate]
        journal.append(agent.id, "agent.checkpoint_expired",
                       {"checkpoint": cp.pk, "turn": 1, "reason": why})
    if fate == "deleted_by_operator":
        journal.append(agent.id, "agent.checkpoint_deleted", {"checkpoint": cp.pk, "turn": 1,
                                                              "by": "root"})
    plan = _plan(info)
    assert (plan.rung, plan.reason) == ("rebuild", reason)


def test_an_older_fact_about_another_checkpoint_does_not_decide(agent, tmp_path):
    old = _checkpoint(agent, tmp_path, 1, deleted=True, file=False)
    journal.append(agent.id, "agent.checkpoint_deleted", {"checkpoint": old.pk, "turn": 1})
    _checkpoint(agent, tmp_path, 2, expires_in=-1)  # the newest expired
    assert _plan(_info(agent)).reason == "checkpoint_expired"


@pytest.mark.parametrize("session", [
    None,                                                     # no session file at all
    {"session_id": "", "bseq": 1, "turns": 1},                # not what a bridge writes
    {"session_id": "s", "bseq": "9", "turns": 1},
    {"session_id": "s", "bseq": 9, "turns": -1},
    {"session_id": "s", "bseq": 9, "turns": 1, "current": {"turn": "1"}},
    ["not", "an", "object"],
])
def test_a_checkpoint_without_a_usable_bridge_session_is_a_rebuild(agent, tmp_path, session):
    _checkpoint(agent, tmp_path, 1, session=session)
    plan = _plan(_info(agent))
    assert (plan.rung, plan.reason) == ("rebuild", "checkpoint_without_session")


def test_a_checkpoint_file_that_cannot_be_read_is_unusable(agent, tmp_path):
    cp = _checkpoint(agent, tmp_path, 1)
    Path(cp.path).write_bytes(b"not a zstd archive")
    plan = _plan(_info(agent))
    assert (plan.rung, plan.reason) == ("rebuild", "checkpoint_unusable")


def test_a_usable_session_says_where_the_restored_bridge_goes_on(agent, tmp_path):
    cp = _checkpoint(agent, tmp_path, 1, session={**SESSION, "current": {"turn": 1}})
    plan = _plan(_info(agent))
    assert (plan.rung, plan.checkpoint["id"], plan.cp_session, plan.cp_head,
            plan.cp_current_turn) == ("restore", cp.pk, "s1", 9, 1)


def test_zero_data_retention_restores_nothing_it_still_holds(agent, tmp_path):
    _checkpoint(agent, tmp_path, 1)
    plan = _plan(_info(agent, zero_retention=True))
    assert (plan.rung, plan.reason) == ("rebuild", "zero_data_retention")


def test_zero_data_retention_is_the_reason_also_when_no_checkpoint_was_ever_kept(agent):
    plan = _plan(_info(agent, zero_retention=True))
    assert (plan.rung, plan.reason) == ("rebuild", "zero_data_retention")


def test_a_checkpoint_refused_as_unusable_says_so(agent, tmp_path):
    _checkpoint(agent, tmp_path, 1)
    plan = _plan(_info(agent), skip_checkpoints=True, reason="checkpoint_unusable")
    assert (plan.rung, plan.reason) == ("rebuild", "checkpoint_unusable")


@pytest.mark.parametrize("data, words", [
    ({"rung": "rebuild", "reason": "no_checkpoint", "cause": "sandbox_missing"},
     "because the sandbox was gone; its files are not back: it never took a checkpoint"),
    ({"rung": "rebuild", "reason": "checkpoint_expired", "cause": "sandbox_missing"},
     "its newest checkpoint had expired"),
    ({"rung": "rebuild", "reason": "checkpoint_deleted"}, "deleted by an operator"),
    ({"rung": "restore", "reason": "sandbox_missing", "checkpoint": 7, "checkpoint_turn": 3},
     "from checkpoint 7 (turn 3) because the sandbox was gone"),
    ({"rung": "reattach", "reason": "control_plane_restart"}, "after the control plane restarted"),
])
def test_the_restore_line_says_it_in_plain_words(data, words):
    assert words in restore_sentence(data)
