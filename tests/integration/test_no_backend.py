"""A machine with neither Docker nor bubblewrap (ALINEO_SANDBOX=auto): the
server starts and serves, `manage.py check` says why nothing can be spawned
(alineo.W007), POST /api/agents is a 409 `sandbox.unavailable`, and the
dashboard's tree page shows it. Simulated for the server process alone: a
DOCKER_HOST that answers nothing and a PATH without bwrap."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.live import LiveServer

pytestmark = pytest.mark.live

ENV = {"ALINEO_SANDBOX": "auto", "DOCKER_HOST": "unix:///nonexistent/docker.sock",
       "PATH": str(Path(sys.executable).parent)}


def test_no_backend_serves_but_refuses_to_spawn():
    with LiveServer(env=ENV) as server:
        check = server.manage("check", check=False)
        assert "alineo.W007" in check.stderr + check.stdout and "bubblewrap" in check.stderr
        assert check.returncode == 0, "a warning, not an error: the server must start"
        actor = server.create_actor("nadia")
        r = httpx.post(f"{server.url}/api/agents", json={"spec": {"model": "demo"}},
                       headers={**actor.auth, "Idempotency-Key": "k1"}, timeout=30)
        assert r.status_code == 409 and r.json()["code"] == "sandbox.unavailable", r.text
        assert "bubblewrap is not installed" in r.json()["message"]
        listed = httpx.get(f"{server.url}/api/agents", headers=actor.auth, timeout=30)
        assert listed.status_code == 200 and listed.json()["agents"] == []
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            page = browser.get("/accounts/login/")
            token = page.cookies["csrftoken"]
            browser.post("/accounts/login/", data={"username": "nadia",
                                                   "password": "nadia-password-123",
                                                   "csrfmiddlewaretoken": token},
                         headers={"Referer": f"{server.url}/accounts/login/"})
            tree = browser.get("/").text
        assert 'id="sandbox-notice"' in tree and "cannot be spawned" in tree
