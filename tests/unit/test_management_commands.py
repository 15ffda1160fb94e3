"""ensure_admin and issue_token, as `make run` and scripts use them."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from sessions.access import user_from_bearer
from sessions.models import Workspace


def run(name, *args, **options) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def fast_hasher(settings):
    # The default PBKDF2 costs ~0.3 s a password; these tests hash a dozen.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def no_admin_password(settings):
    settings.ALINEO_ADMIN_PASSWORD = ""


# --- ensure_admin -----------------------------------------------------------


def generated_password(out: str) -> str:
    line = next(line for line in out.splitlines() if "password:" in line)
    return line.rsplit("password:", 1)[1].strip()


def test_ensure_admin_prints_a_generated_password_once(db, no_admin_password):
    first, _ = run("ensure_admin")
    password = generated_password(first)
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password(password)

    again, _ = run("ensure_admin")
    assert password not in again and "password:" not in again
    assert get_user_model().objects.filter(username="admin").count() == 1


def test_ensure_admin_takes_the_password_from_the_environment(db, settings):
    settings.ALINEO_ADMIN_PASSWORD = "correct-horse-battery"
    out, _ = run("ensure_admin")
    assert "correct-horse-battery" not in out
    assert get_user_model().objects.get(username="admin").check_password("correct-horse-battery")


def test_ensure_admin_never_overwrites_an_existing_password(db, settings, no_admin_password):
    run("ensure_admin")
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("changed-by-hand-1")
    admin.save()
    settings.ALINEO_ADMIN_PASSWORD = "something-else-2"
    _, err = run("ensure_admin")
    assert "ignored" in err
    admin.refresh_from_db()
    assert admin.check_password("changed-by-hand-1")


def test_ensure_admin_makes_the_default_workspace_with_admin_in_it(db, no_admin_password):
    run("ensure_admin")
    run("ensure_admin")
    workspace = Workspace.objects.get(name="default")
    assert list(workspace.members.values_list("username", flat=True)) == ["admin"]


# --- issue_token --------------------------------------------------------------


def test_issue_token_prints_only_a_token_that_authenticates(owner):
    out, _ = run("issue_token", owner.username, label="ci")
    token = out.strip()
    assert out.count("\n") <= 1 and " " not in token
    assert user_from_bearer(f"Bearer {token}") == owner
    assert owner.api_tokens.get().label == "ci"


def test_issue_token_gives_a_new_token_each_time(owner):
    first, second = run("issue_token", owner.username)[0], run("issue_token", owner.username)[0]
    assert first != second
    assert user_from_bearer(f"Bearer {first.strip()}") == owner


def test_issue_token_for_an_unknown_user_fails(db):
    with pytest.raises(CommandError, match="No user named"):
        run("issue_token", "nobody")


def test_issue_token_for_an_inactive_user_fails(owner):
    owner.is_active = False
    owner.save()
    with pytest.raises(CommandError, match="inactive"):
        run("issue_token", owner.username)


def test_issue_token_refuses_an_over_long_label(owner):
    with pytest.raises(CommandError, match="label"):
        run("issue_token", owner.username, label="x" * 101)


def test_issue_token_puts_a_homeless_user_in_the_default_workspace(db):
    user = get_user_model().objects.create_user("wanda", password="wanda-password-1")
    out, err = run("issue_token", "wanda")
    assert "default" in err and "default" not in out
    assert Workspace.objects.get(name="default").members.filter(pk=user.pk).exists()


def test_issue_token_leaves_a_member_where_they_are(owner, workspace):
    _, err = run("issue_token", owner.username)
    assert err == ""
    assert not Workspace.objects.filter(name="default").exists()
