"""Helpers for the JSON API tests: a caller per actor, speaking bearer tokens."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from sessions.models import ApiToken


class Caller:
    """Sends API requests as one actor (or anonymously when token is None)."""

    def __init__(self, token: str | None):
        self.client = Client()
        self.token = token

    def __call__(
        self,
        method: str,
        path: str,
        body=None,
        *,
        key: str | None = None,
        raw: bytes | None = None,
        headers: dict | None = None,
    ):
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if key is not None:
            hdrs["Idempotency-Key"] = key
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return self.client.generic(
            method, path, data, content_type="application/json", headers=hdrs
        )

    def get(self, path: str, **kw):
        return self("GET", path, **kw)

    def post(self, path: str, body=None, **kw):
        return self("POST", path, body, **kw)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # The actor fixtures create users with passwords; PBKDF2 made setup ~0.5 s a test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def api(owner_token):
    return Caller(owner_token)


@pytest.fixture
def anon(db):
    return Caller(None)


@pytest.fixture
def teammate_api(teammate):
    return Caller(ApiToken.issue(teammate)[1])


@pytest.fixture
def outsider_api(outsider):
    return Caller(ApiToken.issue(outsider)[1])


@pytest.fixture
def spawned(api):
    """An agent spawned through the API by the owner; its id."""
    response = api.post("/api/agents", {"spec": {"model": "demo"}})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert (
        isinstance(body.get("code"), str)
        and isinstance(body.get("message"), str)
        and body["message"]
    )
    if code is not None:
        assert body["code"] == code, body
    return body
