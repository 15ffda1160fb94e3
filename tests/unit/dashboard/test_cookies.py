"""Cookies and transport headers (alineo_site/settings.py): HttpOnly and
SameSite=Lax always; Secure, the proxy's scheme header and optional HSTS with
ALINEO_HTTPS=1 (how the variables are read: tests/unit/test_settings.py)."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db

HTTPS = {"SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True,
         "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}
# As a proxy forwards a browser's request: its Host, its https Origin, the scheme it was reached by.
BEHIND_PROXY = {"HTTP_HOST": "testserver", "HTTP_ORIGIN": "https://testserver",
                "HTTP_X_FORWARDED_PROTO": "https"}


def log_in(client, **extra):
    """The login form, then a POST with its CSRF token (as a browser does)."""
    client.get("/accounts/login/", **extra)
    token = client.cookies["csrftoken"].value
    return client.post("/accounts/login/", {"username": "olivia", "password": "olivia-password-123",
                                            "csrfmiddlewaretoken": token}, **extra)


def test_by_default_cookies_are_httponly_and_lax_but_not_secure(owner):
    client = Client(enforce_csrf_checks=True)
    response = log_in(client)
    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert session["httponly"] and session["samesite"] == "Lax" and not session["secure"]
    csrf = client.cookies["csrftoken"]
    assert csrf["samesite"] == "Lax" and not csrf["secure"]


def test_every_page_says_nosniff_same_origin_referrer_and_no_framing(logged_in):
    response = logged_in.get("/")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert "Strict-Transport-Security" not in response  # HSTS is off by default


@override_settings(**HTTPS)
def test_with_https_the_cookies_are_secure_and_a_form_behind_the_proxy_passes_csrf(owner):
    client = Client(enforce_csrf_checks=True)
    response = log_in(client, **BEHIND_PROXY)
    assert response.status_code == 302, response.content[:300]
    assert response.cookies["sessionid"]["secure"] and client.cookies["csrftoken"]["secure"]
    assert response.cookies["sessionid"]["httponly"]


@override_settings(**{**HTTPS, "SECURE_PROXY_SSL_HEADER": None})
def test_without_the_proxy_header_an_https_origin_fails_csrf(owner):
    """Why ALINEO_HTTPS sets SECURE_PROXY_SSL_HEADER: serve speaks plain HTTP."""
    response = log_in(Client(enforce_csrf_checks=True), **BEHIND_PROXY)
    assert response.status_code == 403


@override_settings(**HTTPS, SECURE_HSTS_SECONDS=3600)
def test_hsts_when_asked_for_is_sent_over_https_only(logged_in):
    assert logged_in.get("/", HTTP_X_FORWARDED_PROTO="https")["Strict-Transport-Security"] == "max-age=3600"
    assert "Strict-Transport-Security" not in logged_in.get("/")
