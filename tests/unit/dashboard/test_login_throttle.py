"""Login throttling (django-axes, alineo_site/settings.py): a few failed
logins from one client lock it out of logging in for a while, with a page
that says so (sessions/dashboard/lockout.py); other clients, API bearer
tokens and sessions already logged in are not affected."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

# Documentation addresses (RFC 5737): only strings in REMOTE_ADDR, nothing is sent.
ATTACKER, BYSTANDER = "203.0.113.7", "198.51.100.9"
LOGIN = "/accounts/login/"


def attempt(client, username, password, addr=ATTACKER):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=addr)


def fail(client, username, times, addr=ATTACKER):
    return [attempt(client, username, "wrong", addr).status_code for _ in range(times)]


def test_the_defaults_lock_a_client_out_after_five_failures_for_15_minutes():
    assert settings.AXES_ENABLED and settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    assert settings.AXES_LOCKOUT_PARAMETERS == ["ip_address"]
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"


def test_a_failure_is_the_login_form_again_with_its_error(client, owner):
    response = attempt(client, "olivia", "wrong")
    assert response.status_code == 200 and "field-error" in response.content.decode()


def test_fewer_failures_than_the_limit_still_let_the_right_password_in(client, owner):
    assert fail(client, "olivia", 4) == [200] * 4
    response = attempt(client, "olivia", "olivia-password-123")
    assert response.status_code == 302 and response["Location"] == "/"


def test_the_limit_locks_the_client_out_with_a_clear_page(client, owner):
    statuses = fail(client, "olivia", 5)
    assert statuses[:4] == [200] * 4 and statuses[4] == 429
    response = attempt(client, "olivia", "olivia-password-123")  # even the right password
    assert response.status_code == 429 and "_auth_user_id" not in client.session
    html = response.content.decode()
    assert "Too many failed logins" in html and "15 minutes" in html
    assert response["Retry-After"] == "900"
    assert "registration/locked_out.html" in [t.name for t in response.templates]
    # Guessing at another account from the same client is refused as well.
    assert attempt(client, "tomas", "tomas-password-123").status_code == 429


def test_the_admin_login_is_throttled_alike(client, owner):
    owner.is_staff = True
    owner.save()
    for _ in range(5):
        client.post("/admin/login/", {"username": "olivia", "password": "wrong"}, REMOTE_ADDR=ATTACKER)
    response = client.post("/admin/login/", {"username": "olivia", "password": "olivia-password-123"},
                           REMOTE_ADDR=ATTACKER)
    assert response.status_code == 429


def test_another_client_is_not_locked_out(client, owner):
    fail(client, "olivia", 6)
    response = attempt(Client(), "olivia", "olivia-password-123", addr=BYSTANDER)
    assert response.status_code == 302


def test_api_tokens_and_logged_in_sessions_keep_working(client, owner, owner_token, teammate):
    fail(client, "olivia", 6)
    api = Client().get("/api/agents", HTTP_AUTHORIZATION=f"Bearer {owner_token}", REMOTE_ADDR=ATTACKER)
    assert api.status_code == 200
    browser = Client()
    browser.force_login(teammate)
    assert browser.get("/", REMOTE_ADDR=ATTACKER).status_code == 200
    assert browser.get("/api/agents", REMOTE_ADDR=ATTACKER).status_code == 200


def test_the_lockout_ends_after_the_cool_off(client, owner):
    fail(client, "olivia", 5)
    assert attempt(client, "olivia", "olivia-password-123").status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert attempt(client, "olivia", "olivia-password-123").status_code == 302


def test_by_client_and_username_a_shared_address_locks_out_one_account(client, owner, teammate,
                                                                       settings):
    """ALINEO_LOGIN_LOCKOUT_BY=client_and_username, for deployments behind a proxy."""
    settings.AXES_LOCKOUT_PARAMETERS = [["ip_address", "username"]]
    fail(client, "olivia", 5)
    assert attempt(client, "olivia", "olivia-password-123").status_code == 429
    assert attempt(Client(), "tomas", "tomas-password-123").status_code == 302


def test_zero_failures_turns_throttling_off(client, owner, settings):
    settings.AXES_ENABLED = False
    fail(client, "olivia", 8)
    assert attempt(client, "olivia", "olivia-password-123").status_code == 302


def test_an_attempt_during_the_lockout_starts_the_wait_again(client, owner):
    fail(client, "olivia", 5)
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=10))
    assert attempt(client, "olivia", "olivia-password-123").status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=10))
    assert attempt(client, "olivia", "olivia-password-123").status_code == 429  # 10 < 15 min
