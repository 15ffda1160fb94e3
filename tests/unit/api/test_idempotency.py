"""Idempotency-Key on every POST: same key → same response, no second effect."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
from django.db import connection, connections

from sessions import commands
from sessions.models import Agent, Command, Event
from tests.engines import database_env

from .conftest import Caller, assert_error

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def counts():
    return Agent.objects.count(), Event.objects.count(), Command.objects.count()


def test_same_key_same_body_returns_the_first_response_with_no_second_effect(api):
    first = api.post("/api/agents", {"prompt": "hi"}, key="spawn-1")
    before = counts()
    again = api.post("/api/agents", {"prompt": "hi"}, key="spawn-1")
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert counts() == before


def test_same_body_in_other_words_is_the_same_request(api):
    first = api.post("/api/agents", raw=b'{"spec": {"model": "demo", "checkpoint": true}}', key="k")
    again = api.post("/api/agents", raw=b'{ "spec":{"checkpoint":true,"model":"demo"} }', key="k")
    assert again.json() == first.json()


@pytest.mark.parametrize("verb", ["prompt", "steer", "interrupt", "pause", "resume", "stop"])
def test_commands_replay_too(api, spawned, verb):
    body = {"text": "x"} if verb in ("prompt", "steer") else {}
    first = api.post(f"/api/agents/{spawned}/{verb}", body, key=f"{verb}-1")
    before = counts()
    again = api.post(f"/api/agents/{spawned}/{verb}", body, key=f"{verb}-1")
    assert (again.status_code, again.json()) == (202, first.json())
    assert counts() == before


def test_a_replayed_stop_is_not_a_409(api, spawned):
    first = api.post(f"/api/agents/{spawned}/stop", key="stop-1")
    again = api.post(f"/api/agents/{spawned}/stop", key="stop-1")
    assert again.status_code == 202 and again.json() == first.json()
    assert_error(api.post(f"/api/agents/{spawned}/stop", key="stop-2"), 409, "agent.stopped")


def test_same_key_different_body_is_422_and_writes_nothing(api, spawned):
    api.post(f"/api/agents/{spawned}/prompt", {"text": "one"}, key="p")
    before = counts()
    assert_error(
        api.post(f"/api/agents/{spawned}/prompt", {"text": "two"}, key="p"),
        422,
        "idempotency.key_reused",
    )
    assert_error(
        api.post(f"/api/agents/{spawned}/steer", {"text": "one"}, key="p"),
        422,
        "idempotency.key_reused",
    )
    assert_error(api.post("/api/agents", {}, key="p"), 422, "idempotency.key_reused")
    assert counts() == before


def test_same_key_for_another_agent_is_422(api, spawned):
    other = api.post("/api/agents", {}).json()["id"]
    api.post(f"/api/agents/{spawned}/interrupt", key="i")
    assert_error(api.post(f"/api/agents/{other}/interrupt", key="i"), 422, "idempotency.key_reused")


def test_keys_belong_to_their_user(api, teammate_api, spawned):
    mine = api.post(f"/api/agents/{spawned}/prompt", {"text": "a"}, key="shared")
    theirs = teammate_api.post(f"/api/agents/{spawned}/prompt", {"text": "a"}, key="shared")
    assert theirs.status_code == 202 and theirs.json()["command"] != mine.json()["command"]


def test_a_refused_request_does_not_use_up_its_key(api, spawned):
    assert_error(api.post("/api/agents", {"spec": {"gpu": 1}}, key="fix-me"), 400)
    assert_error(api.post("/api/agents", {"parent": "ag_nope"}, key="fix-me"), 404)
    assert api.post("/api/agents", {}, key="fix-me").status_code == 201


def test_requests_without_a_key_each_act(api, spawned):
    api.post(f"/api/agents/{spawned}/prompt", {"text": "a"})
    api.post(f"/api/agents/{spawned}/prompt", {"text": "a"})
    assert Event.objects.filter(agent_id=spawned, type="command.prompt").count() == 2


@pytest.mark.parametrize("key", ["k" * 256, "", "   ", "tab\there", "nul\x00", "caf\xe9"])
def test_bad_keys_are_400(api, spawned, key):
    assert_error(
        api.post(f"/api/agents/{spawned}/prompt", {"text": "a"}, key=key),
        400,
        "idempotency.key_invalid",
    )
    assert_error(api.post("/api/agents", {}, key=key), 400, "idempotency.key_invalid")
    assert Agent.objects.count() == 1


def test_a_255_character_key_is_fine(api):
    key = "k" * 255
    first = api.post("/api/agents", {}, key=key)
    assert first.status_code == 201 and api.post("/api/agents", {}, key=key).json() == first.json()


def test_a_concurrent_duplicate_gets_the_stored_response(api, spawned):
    """Two requests with one key both passed the lookup: the unique constraint refuses the
    second one's row, its whole transaction rolls back, and it answers with the first's response."""
    first = api.post(f"/api/agents/{spawned}/prompt", {"text": "a"}, key="race")
    before = counts()
    real = commands.base.stored_outcome
    calls = []

    def racing(*args):
        calls.append(args)
        return (
            None if len(calls) == 1 else real(*args)
        )  # the first lookup ran "before" the other commit

    with mock.patch.object(commands.base, "stored_outcome", side_effect=racing):
        again = api.post(f"/api/agents/{spawned}/prompt", {"text": "a"}, key="race")
    assert (again.status_code, again.json()) == (202, first.json())
    assert counts() == before and len(calls) == 2


@pytest.mark.django_db(transaction=True)
def test_parallel_duplicates_act_once(owner_token):
    spawned = Caller(owner_token).post("/api/agents", {}).json()["id"]
    results, errors = [], []

    def send():
        try:
            response = Caller(owner_token).post(
                f"/api/agents/{spawned}/prompt", {"text": "once"}, key="par"
            )
            results.append((response.status_code, response.json()))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 6
    assert len({json.dumps(r, sort_keys=True) for r in results}) == 1 and results[0][0] == 202
    assert Event.objects.filter(agent_id=spawned, type="command.prompt").count() == 1
    assert Command.objects.filter(idempotency_key="par").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_key_holds_across_a_restart(owner, owner_token):
    """Another process (a restarted server) sees the stored response: it lives in the database."""
    first = Caller(owner_token).post("/api/agents", {"prompt": "hi"}, key="restart-1").json()
    connections.close_all()
    script = (
        "import django, json; django.setup();"
        "from django.contrib.auth import get_user_model; from sessions import commands;"
        f"user = get_user_model().objects.get(pk={owner.pk});"
        "out = commands.spawn(user, {'prompt': 'hi'}, 'restart-1');"
        "print(json.dumps([out.status, out.body, out.replayed]))"
    )
    env = database_env(dict(os.environ, DJANGO_SETTINGS_MODULE="alineo_site.settings"))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    status, body, replayed = json.loads(done.stdout.strip().splitlines()[-1])
    assert (status, body, replayed) == (201, first, True)
    assert Agent.objects.count() == 1
