import pytest
from django.utils import formats, timezone

from sessions.admin import QUOTA_FIELDS
from sessions.models import Checkpoint, Event, Workspace

pytestmark = pytest.mark.django_db


def quota_fields(ws) -> dict:
    """The quota inputs as the change page posts them (tests/unit/dashboard/
    test_admin_quotas.py edits them)."""
    return {name: getattr(ws, name) for name in QUOTA_FIELDS}


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="root-password-123")
    client.force_login(admin)
    return client


def _post(client, ws, days, keep=3, zdr=False):
    data = {"name": ws.name, "checkpoint_max_age_days": days, "keep_newest_checkpoints": keep,
            **quota_fields(ws)}
    if zdr:
        data["zero_data_retention"] = "on"
    return client.post(f"/admin/agent_sessions/workspace/{ws.pk}/change/", data)


def test_over_30_days_is_refused_with_a_clear_message(admin_client, workspace):
    response = _post(admin_client, workspace, 45)
    html = response.content.decode()
    assert response.status_code == 200
    assert "Checkpoints can be kept at most 30 days; 45 is too long." in html
    workspace.refresh_from_db()
    assert workspace.checkpoint_max_age_days == 30


def test_shortening_is_saved(admin_client, workspace):
    assert _post(admin_client, workspace, 7, keep=2, zdr=True).status_code == 302
    workspace.refresh_from_db()
    assert (workspace.checkpoint_max_age_days, workspace.keep_newest_checkpoints,
            workspace.zero_data_retention) == (7, 2, True)


def test_change_page_shows_the_sweeps_effect(admin_client, workspace, agent):
    now = timezone.now()
    for days_old in (1, 10, 20):
        cp = Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=days_old, through_seq=1,
                                       expires_at=now + timezone.timedelta(days=30 - days_old))
        Checkpoint.objects.filter(pk=cp.pk).update(created_at=now - timezone.timedelta(days=days_old))
    Workspace.objects.filter(pk=workspace.pk).update(checkpoint_max_age_days=7, keep_newest_checkpoints=1)
    html = admin_client.get(f"/admin/agent_sessions/workspace/{workspace.pk}/change/").content.decode()
    assert "Live checkpoints: <strong>3</strong>" in html
    assert "Older than 7 days or expired (removed by the next sweep): <strong>2</strong>" in html
    assert "Beyond the newest 1 per agent (removed by the next sweep): <strong>2</strong>" in html


def test_checkpoint_list_filters_and_actions(admin_client, workspace, agent, tmp_path, settings):
    now = timezone.now()
    live = Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=1, through_seq=1,
                                     expires_at=now + timezone.timedelta(days=3))
    old = Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=2, through_seq=2,
                                    expires_at=now - timezone.timedelta(days=1))
    url = "/admin/agent_sessions/checkpoint/"
    html = admin_client.get(url + "?expired=yes").content.decode()
    assert f"/checkpoint/{old.pk}/" in html and f"/checkpoint/{live.pk}/" not in html
    html = admin_client.get(url + f"?agent__workspace__id__exact={workspace.pk}").content.decode()
    assert f"/checkpoint/{live.pk}/" in html

    admin_client.post(url, {"action": "expire_now", "_selected_action": [live.pk]})
    live.refresh_from_db()
    assert live.expires_at <= timezone.now() and live.deleted_at is None

    archive = settings.DATA_DIR / "checkpoints" / agent.id / "cp-test.tar.zst"
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(b"x")
    Checkpoint.objects.filter(pk=live.pk).update(path=str(archive))
    admin_client.post(url, {"action": "delete_now", "_selected_action": [live.pk]})
    live.refresh_from_db()
    assert live.deleted_at is not None and not archive.exists()
    # The transcript says who deleted it (a rebuild after it says checkpoint_deleted).
    facts = list(Event.objects.filter(agent=agent, type="agent.checkpoint_deleted")
                 .values_list("data", flat=True))
    assert facts == [{"checkpoint": live.pk, "turn": 1, "by": "root"}]
    admin_client.post(url, {"action": "delete_now", "_selected_action": [live.pk]})
    assert Event.objects.filter(agent=agent, type="agent.checkpoint_deleted").count() == 1


def test_delete_now_deletes_no_file_outside_the_checkpoints(admin_client, agent, settings):
    elsewhere = settings.DATA_DIR / "secret_key-copy"
    elsewhere.write_bytes(b"keep me")
    cp = Checkpoint.objects.create(agent=agent, sandbox_id="sb", turn=1, through_seq=1,
                                   path=str(elsewhere),
                                   expires_at=timezone.now() + timezone.timedelta(days=3))
    admin_client.post("/admin/agent_sessions/checkpoint/",
                      {"action": "delete_now", "_selected_action": [cp.pk]})
    cp.refresh_from_db()
    assert cp.deleted_at is not None and elsewhere.read_bytes() == b"keep me"


def test_non_staff_cannot_reach_admin(client, owner, workspace):
    client.force_login(owner)
    response = client.get(f"/admin/agent_sessions/workspace/{workspace.pk}/change/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_the_checkpoint_list_shows_expiry_under_the_policy(admin_client, agent):
    now = timezone.now()
    cp = Checkpoint.objects.create(agent=agent, sandbox_id="sb-1", turn=1, through_seq=0,
                                   bytes=10, expires_at=now + timezone.timedelta(days=29))
    Checkpoint.objects.filter(pk=cp.pk).update(created_at=now - timezone.timedelta(days=10))
    agent.workspace.checkpoint_max_age_days = 7
    agent.workspace.save()
    cp.refresh_from_db()
    listing = admin_client.get("/admin/agent_sessions/checkpoint/").content.decode()
    shown = [formats.localize(timezone.localtime(when)) for when in
             (cp.created_at + timezone.timedelta(days=7), cp.expires_at)]
    assert shown[0] in listing and shown[1] not in listing  # the policy's date, not the row's
    expired = admin_client.get("/admin/agent_sessions/checkpoint/?expired=yes").content.decode()
    live = admin_client.get("/admin/agent_sessions/checkpoint/?expired=no").content.decode()
    assert f'value="{cp.pk}"' in expired and f'value="{cp.pk}"' not in live
