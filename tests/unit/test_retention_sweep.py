from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from sessions.worker.retention import sweep
from sessions import journal
from sessions.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


def _checkpoint(agent, turn, *, age_days=0, expires_in_days=30):
    folder = Path(settings.DATA_DIR) / "checkpoints" / agent.id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sb-turn-{turn}.tar.zst"
    path.write_bytes(b"x" * 10)
    created = timezone.now() - timedelta(days=age_days)
    cp = Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=turn, through_seq=turn,
                                   path=str(path), bytes=10,
                                   expires_at=created + timedelta(days=expires_in_days))
    Checkpoint.objects.filter(pk=cp.pk).update(created_at=created)
    return Checkpoint.objects.get(pk=cp.pk)


def _expired_facts(agent):
    return [e.data for e in journal.page_after(agent.id, 0, 100).events if e.type == "agent.checkpoint_expired"]


def test_a_shortened_policy_removes_older_checkpoints_and_says_so(agent, workspace):
    old = _checkpoint(agent, 1, age_days=10)
    new = _checkpoint(agent, 2, age_days=1)
    assert sweep().removed == 0
    workspace.checkpoint_max_age_days = 7
    workspace.save()
    run = sweep()
    assert run.removed == 1 and run.by_reason == {"policy_max_age": 1}
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.deleted_at is not None and not Path(old.path).exists()
    assert new.deleted_at is None and Path(new.path).exists()
    # expires_at is never moved: the row keeps what it promised
    assert old.expires_at == old.created_at + timedelta(days=30)
    assert _expired_facts(agent) == [{"checkpoint": old.pk, "turn": 1, "reason": "policy_max_age"}]
    assert sweep().removed == 0  # nothing twice


def test_own_expiry_keep_newest_and_zero_retention(agent, workspace):
    expired = _checkpoint(agent, 1, age_days=2, expires_in_days=1)
    kept = [_checkpoint(agent, t) for t in (2, 3, 4, 5)]
    workspace.keep_newest_checkpoints = 3
    workspace.save()
    run = sweep()
    assert run.by_reason == {"expired": 1, "beyond_newest": 1}
    live = set(Checkpoint.objects.filter(deleted_at=None).values_list("turn", flat=True))
    assert live == {3, 4, 5} and expired.turn not in live and kept[0].turn not in live
    workspace.zero_data_retention = True
    workspace.save()
    assert sweep().by_reason == {"zero_data_retention": 3}
    assert not any(Path(cp.path).exists() for cp in Checkpoint.objects.all())


def test_a_path_outside_the_data_dir_is_never_deleted(agent, tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    cp = _checkpoint(agent, 1, expires_in_days=0)
    Checkpoint.objects.filter(pk=cp.pk).update(path=str(outside))
    assert sweep().removed == 1
    assert outside.read_text() == "keep me"


def test_lengthening_the_policy_never_lengthens_a_checkpoints_life(agent, workspace):
    workspace.checkpoint_max_age_days = 7
    workspace.save()
    cp = _checkpoint(agent, 1, age_days=8, expires_in_days=7)  # taken under the 7-day policy
    workspace.checkpoint_max_age_days = 30  # lengthened later (allowed up to 30 for new ones)
    workspace.save()
    assert sweep().by_reason == {"expired": 1}  # its own expiry still holds
    cp.refresh_from_db()
    assert cp.deleted_at is not None and cp.expires_at == cp.created_at + timedelta(days=7)
