"""POST /api/agents/{id}/{prompt|steer|interrupt|pause|resume|stop}."""

import pytest

from sessions import journal
from sessions.models import Agent, Command, CommandState, Event

from .conftest import assert_error

pytestmark = pytest.mark.django_db

VERBS = ["prompt", "steer", "interrupt", "pause", "resume", "stop"]


def body_for(verb):
    return {"text": "say: hello"} if verb in ("prompt", "steer") else {}


def last_facts(agent_id, n):
    rows = Event.objects.filter(agent_id=agent_id).order_by("-seq")[:n]
    return [(e.type, e.data) for e in reversed(rows)]


@pytest.mark.parametrize("verb", VERBS)
def test_each_command_is_a_fact_and_a_pending_command(api, owner, spawned, verb):
    response = api.post(f"/api/agents/{spawned}/{verb}", body_for(verb))
    assert response.status_code == 202
    body = response.json()
    assert body == {
        "command": body["command"],
        "agent": spawned,
        "verb": verb,
        "seq": 2,
        "state": "pending",
    }
    fact = Event.objects.get(agent_id=spawned, seq=2)
    assert fact.type == f"command.{verb}"
    assert fact.data["command"] == body["command"] and fact.data["by"] == owner.username
    cmd = Command.objects.get(pk=body["command"])
    assert (cmd.verb, cmd.state, cmd.seq, cmd.agent_id, cmd.response_status) == (
        verb,
        CommandState.PENDING,
        2,
        spawned,
        202,
    )


def test_prompt_carries_the_text(api, spawned):
    api.post(f"/api/agents/{spawned}/prompt", {"text": "run: ls"})
    assert last_facts(spawned, 1)[0][1]["text"] == "run: ls"


def test_pause_then_resume_restores_the_status(api, spawned):
    journal.append_many(spawned, [("turn.started", {}), ("turn.finished", {})])  # now idle
    api.post(f"/api/agents/{spawned}/pause")
    assert Agent.objects.get(pk=spawned).status == "paused"
    assert last_facts(spawned, 1)[0][1]["status"] == "paused"
    api.post(f"/api/agents/{spawned}/resume")
    assert Agent.objects.get(pk=spawned).status == "idle"
    assert [t for t, _ in last_facts(spawned, 2)] == ["command.resume", "agent.status"]


def test_resume_of_a_running_agent_goes_back_to_running(api, spawned):
    journal.append(spawned, "turn.started", {})
    api.post(f"/api/agents/{spawned}/pause")
    api.post(f"/api/agents/{spawned}/resume")
    assert Agent.objects.get(pk=spawned).status == "running"


def test_pause_twice_and_resume_when_not_paused_change_no_status(api, spawned):
    api.post(f"/api/agents/{spawned}/pause")
    api.post(f"/api/agents/{spawned}/pause")
    assert [t for t, _ in last_facts(spawned, 3)] == [
        "command.pause",
        "agent.status",
        "command.pause",
    ]
    api.post(f"/api/agents/{spawned}/resume")
    api.post(f"/api/agents/{spawned}/resume")
    assert last_facts(spawned, 1)[0][0] == "command.resume"
    assert Agent.objects.get(pk=spawned).status == "starting"


def test_stop_stops_and_later_commands_are_409(api, spawned):
    assert api.post(f"/api/agents/{spawned}/stop", {"reason": "done"}).status_code == 202
    agent = Agent.objects.get(pk=spawned)
    assert agent.status == "stopped"
    assert last_facts(spawned, 2)[0][1]["reason"] == "done"
    before = Event.objects.count(), Command.objects.count()
    for verb in VERBS:
        body = assert_error(
            api.post(f"/api/agents/{spawned}/{verb}", body_for(verb)), 409, "agent.stopped"
        )
        assert "stopped" in body["message"] and "transcript" in body["message"]
    assert (Event.objects.count(), Command.objects.count()) == before


@pytest.mark.parametrize(
    "status, code", [("lost", "agent.lost"), ("unrecoverable", "agent.unrecoverable")]
)
def test_lost_and_unrecoverable_agents_refuse_commands(api, spawned, status, code):
    journal.append(
        spawned, "agent.status", {"status": status, "reason": "credential held for approval"}
    )
    body = assert_error(api.post(f"/api/agents/{spawned}/prompt", {"text": "hi"}), 409, code)
    assert "credential held for approval" in body["message"]


def test_a_cannot_write_mark_clears_once_a_write_succeeds(
    api, spawned, monkeypatch, django_capture_on_commit_callbacks
):
    # The mark only says the last append failed; the next command tries again.
    monkeypatch.setitem(journal._unwritable_marks, spawned, "disk full")
    assert api.get(f"/api/agents/{spawned}").json()["status"] == "unrecoverable"
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/agents/{spawned}/steer", {"text": "hi"}).status_code == 202
    assert spawned not in journal._unwritable_marks
    assert api.get(f"/api/agents/{spawned}").json()["status"] != "unrecoverable"


@pytest.mark.parametrize("verb", VERBS)
def test_teammate_can_command(teammate_api, spawned, verb):
    assert teammate_api.post(f"/api/agents/{spawned}/{verb}", body_for(verb)).status_code == 202


@pytest.mark.parametrize("verb", VERBS)
def test_outsider_and_unknown_get_404(outsider_api, api, spawned, verb):
    assert_error(
        outsider_api.post(f"/api/agents/{spawned}/{verb}", body_for(verb)), 404, "agent.not_found"
    )
    assert_error(api.post(f"/api/agents/ag_missing/{verb}", body_for(verb)), 404, "agent.not_found")
    assert Event.objects.count() == 1


@pytest.mark.parametrize("verb", VERBS)
def test_anonymous_gets_401(anon, spawned, verb):
    assert_error(anon.post(f"/api/agents/{spawned}/{verb}", body_for(verb)), 401)


@pytest.mark.parametrize("verb", VERBS)
def test_get_is_405(api, spawned, verb):
    assert_error(api.get(f"/api/agents/{spawned}/{verb}"), 405, "method.not_allowed")


@pytest.mark.parametrize(
    "verb, body, code",
    [
        ("prompt", {}, "request.invalid"),
        ("prompt", None, "request.invalid"),
        ("prompt", {"text": ""}, "request.invalid"),
        ("prompt", {"text": "   "}, "request.invalid"),
        ("prompt", {"text": 5}, "request.invalid"),
        ("prompt", {"text": None}, "request.invalid"),
        ("steer", {"text": "hi", "urgent": True}, "request.unknown_keys"),
        ("steer", {"text": "a\x00b"}, "request.invalid"),
        ("stop", {"reason": 3}, "request.invalid"),
        ("pause", {"force": True}, "request.unknown_keys"),
        ("interrupt", [], "request.invalid"),
        ("resume", "now", "request.invalid"),
    ],
)
def test_bad_bodies_are_400_and_write_nothing(api, spawned, verb, body, code):
    assert_error(api.post(f"/api/agents/{spawned}/{verb}", body), 400, code)
    assert Event.objects.count() == 1 and Command.objects.count() == 1


def test_lone_surrogate_text_is_400(api, spawned):
    assert_error(
        api.post(f"/api/agents/{spawned}/prompt", raw=b'{"text": "\\ud800"}'),
        400,
        "request.invalid",
    )


def test_over_long_text_is_400(api, spawned, settings):
    settings.ALINEO_MAX_TEXT = 5
    body = assert_error(
        api.post(f"/api/agents/{spawned}/prompt", {"text": "123456"}), 400, "request.text_too_long"
    )
    assert "5" in body["message"]
    assert api.post(f"/api/agents/{spawned}/prompt", {"text": "12345"}).status_code == 202


def test_malformed_json_is_400(api, spawned):
    assert_error(
        api.post(f"/api/agents/{spawned}/prompt", raw=b'{"text": '), 400, "request.malformed_json"
    )
