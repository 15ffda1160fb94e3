"""What the API shell answers when something other than the client goes wrong."""

import json
import logging
from unittest import mock

import pytest
from django.db import OperationalError

from sessions import commands
from sessions.models import Agent

from .conftest import assert_error

pytestmark = pytest.mark.django_db


def test_401_names_the_scheme(anon):
    response = anon.get("/api/agents")
    assert_error(response, 401, "auth.required")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_too_large_body_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    assert_error(api.post("/api/agents", {"prompt": "x" * 200}), 413, "request.too_large")
    assert Agent.objects.count() == 0


def test_a_busy_database_is_a_503_with_retry_after(api):
    with mock.patch.object(commands, "spawn", side_effect=OperationalError("database is locked")):
        response = api.post("/api/agents", {})
    assert_error(response, 503, "server.unavailable")
    assert response["Retry-After"] == "1"


def test_a_bug_is_a_logged_json_500(api, caplog):
    with (
        mock.patch.object(commands, "spawn", side_effect=RuntimeError("boom")),
        caplog.at_level(logging.ERROR, logger="sessions.api.handler"),
    ):
        response = api.post("/api/agents", {})
    assert_error(response, 500, "server.error")
    assert any("boom" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_a_failed_journal_write_rolls_the_whole_command_back(api, spawned):
    """The fact and the command commit together or not at all."""
    from sessions import journal
    from sessions.models import Command, Event

    before = Event.objects.count(), Command.objects.count()
    with mock.patch.object(
        journal, "append_many", side_effect=journal.JournalUnavailable("disk full")
    ):
        assert_error(
            api.post(f"/api/agents/{spawned}/prompt", {"text": "hi"}), 503, "server.unavailable"
        )
        assert_error(api.post("/api/agents", {"parent": spawned}), 503, "server.unavailable")
    assert (Event.objects.count(), Command.objects.count()) == before
    assert Agent.objects.count() == 1


@pytest.mark.parametrize("name, status", [("400", 400), ("403", 403), ("404", 404), ("500", 500)])
def test_site_error_handlers_answer_json_under_api_only(rf, name, status):
    from sessions.api import views

    handler = getattr(views, f"handler{name}")
    args = () if name == "500" else (None,)
    api = handler(rf.get("/api/agents/x"), *args)
    assert api.status_code == status and api["Content-Type"] == "application/json"
    assert set(json.loads(api.content)) >= {"code", "message"}
    page = handler(rf.get("/somewhere"), *args)
    assert page.status_code == status and "json" not in page["Content-Type"]
