"""POST /api/agents: spawn."""

import asyncio
import threading
from unittest import mock

import pytest
from channels.layers import InMemoryChannelLayer
from django.contrib.auth import get_user_model
from django.test import Client

from sessions import commands, wakeups
from sessions.models import Agent, ApiToken, Command, CommandState, Event, Workspace

from .conftest import Caller, assert_error

pytestmark = pytest.mark.django_db


def facts(agent_id):
    return list(Event.objects.filter(agent_id=agent_id).order_by("seq").values_list("type", "data"))


def test_spawn_returns_201_and_journals_the_fact(api, owner, workspace):
    response = api.post("/api/agents", {"spec": {"model": "demo"}})
    assert response.status_code == 201
    body = response.json()
    assert set(body) >= {"id", "status", "sandbox_id", "parent"}
    assert body["status"] == "starting" and body["sandbox_id"] is None and body["parent"] is None
    agent = Agent.objects.get(pk=body["id"])
    assert agent.workspace == workspace and agent.created_by == owner and agent.last_seq == 1
    [(etype, data)] = facts(agent.id)
    assert etype == "agent.spawned"
    assert (
        data["spec"]["model"] == "demo" and data["spec"]["image"] == "default"
    )  # defaults filled in
    assert data["parent"] is None and data["by"] == owner.username
    cmd = Command.objects.get(pk=body["command"])
    assert (cmd.verb, cmd.state, cmd.seq, cmd.agent_id) == (
        "spawn",
        CommandState.PENDING,
        1,
        agent.id,
    )
    assert cmd.response_status == 201 and cmd.response_body == body


def test_spawn_without_a_spec_uses_the_defaults(api):
    response = api.post("/api/agents", {})
    assert response.status_code == 201
    assert Agent.objects.get(pk=response.json()["id"]).spec["model"] == "demo"


def test_spawn_with_an_empty_body_uses_the_defaults(api):
    assert api.post("/api/agents", raw=b"").status_code == 201


def test_spawn_with_a_prompt_journals_it_as_a_command(api):
    body = api.post("/api/agents", {"spec": {"model": "demo"}, "prompt": "say: hi"}).json()
    types = [t for t, _ in facts(body["id"])]
    assert types == ["agent.spawned", "command.prompt"]
    prompt = facts(body["id"])[1][1]
    assert prompt["text"] == "say: hi"
    cmd = Command.objects.get(pk=prompt["command"])
    assert (cmd.verb, cmd.seq, cmd.idempotency_key) == ("prompt", 2, None)


def test_spawn_under_a_parent_records_the_tree(api, spawned):
    child = api.post("/api/agents", {"parent": spawned}).json()
    assert child["parent"] == spawned
    assert Agent.objects.get(pk=child["id"]).parent_id == spawned
    assert facts(spawned)[-1] == (
        "agent.child_spawned",
        {"child": child["id"], "command": child["command"]},
    )
    assert facts(child["id"])[0][1]["parent"] == spawned


def test_child_lives_in_the_parents_workspace(api, teammate_api, spawned, workspace):
    child = teammate_api.post("/api/agents", {"parent": spawned})
    assert child.status_code == 201
    assert Agent.objects.get(pk=child.json()["id"]).workspace == workspace


def test_spec_in_the_transcript_is_secret_free(api):
    from sessions.credentials import set_secret

    set_secret(Workspace.objects.get(), "openai", "sk-canary-secret-value")
    spec = {"credentials": [{"name": "openai", "env": "OPENAI_API_KEY"}]}
    body = api.post("/api/agents", {"spec": spec}).json()
    assert facts(body["id"])[0][1]["spec"]["credentials"] == [
        {"name": "openai", "env": "OPENAI_API_KEY", "approval": "auto"}
    ]
    assert "sk-canary-secret-value" not in str(facts(body["id"]))


def test_a_secret_in_a_spec_is_refused(api):
    spec = {"credentials": [{"name": "openai", "env": "OPENAI_API_KEY", "value": "sk-live"}]}
    body = assert_error(api.post("/api/agents", {"spec": spec}), 400, "spec.invalid")
    assert body["field"] == "credentials[0]"
    assert Agent.objects.count() == 0


def test_anonymous_gets_401(anon):
    response = anon.post("/api/agents", {})
    assert_error(response, 401, "auth.required")
    assert Agent.objects.count() == 0


def test_a_bad_token_gets_401(db):
    assert_error(Caller("aln_not-a-token").post("/api/agents", {}), 401, "auth.invalid_token")


def test_an_inactive_users_token_gets_401(owner, owner_token):
    owner.is_active = False
    owner.save()
    assert_error(Caller(owner_token).post("/api/agents", {}), 401)


def test_outsiders_parent_is_a_404(outsider_api, spawned):
    assert_error(outsider_api.post("/api/agents", {"parent": spawned}), 404, "parent.not_found")
    assert Agent.objects.count() == 1 and Event.objects.count() == 1


def test_unknown_parent_is_a_404(api):
    assert_error(api.post("/api/agents", {"parent": "ag_nope"}), 404, "parent.not_found")


def test_a_stopped_parent_takes_no_children(api, spawned):
    api.post(f"/api/agents/{spawned}/stop")
    assert_error(api.post("/api/agents", {"parent": spawned}), 409, "agent.stopped")
    assert Agent.objects.count() == 1


def test_a_user_without_a_workspace_gets_403(db):
    loner = get_user_model().objects.create_user("lone")
    assert_error(Caller(ApiToken.issue(loner)[1]).post("/api/agents", {}), 403, "workspace.none")
    assert Agent.objects.count() == 0


@pytest.mark.parametrize(
    "body, code",
    [
        ({"spec": {"model": "demo", "gpu": True}}, "spec.invalid"),
        ({"spec": {"limits": {"memory_mb": -1}}}, "spec.invalid"),
        ({"spec": "demo"}, "spec.invalid"),
        ({"spec": {}, "colour": "red"}, "request.unknown_keys"),
        ({"parent": 7}, "request.invalid"),
        ({"prompt": ""}, "request.invalid"),
        ({"prompt": ["say: hi"]}, "request.invalid"),
        ({"prompt": "a\x00b"}, "request.invalid"),
        ([1, 2], "request.invalid"),
        ("spawn", "request.invalid"),
    ],
)
def test_bad_bodies_are_400_and_write_nothing(api, body, code):
    assert_error(api.post("/api/agents", body), 400, code)
    assert Agent.objects.count() == Event.objects.count() == Command.objects.count() == 0


def test_unknown_spec_key_is_named(api):
    body = assert_error(api.post("/api/agents", {"spec": {"model": "demo", "gpu": True}}), 400)
    assert "gpu" in body["message"] and body["field"] == "gpu"


@pytest.mark.parametrize(
    "raw", [b"{", b"{'a': 1}", b"\xff\xfe", b'{"spec": NaN}', b'{"prompt": 1e999}', b"[" * 5000]
)
def test_malformed_json_is_400(api, raw):
    assert_error(api.post("/api/agents", raw=raw), 400, "request.malformed_json")
    assert Agent.objects.count() == 0


def test_over_long_prompt_is_400(api, settings):
    settings.ALINEO_MAX_TEXT = 10
    assert_error(api.post("/api/agents", {"prompt": "x" * 11}), 400, "request.text_too_long")
    assert Agent.objects.count() == 0


def test_wrong_method_is_405_json(api):
    response = api("DELETE", "/api/agents")
    assert_error(response, 405, "method.not_allowed")
    assert "POST" in response["Allow"]


def test_session_post_needs_the_csrf_token(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post("/api/agents", "{}", content_type="application/json")
    assert_error(response, 403, "auth.csrf_failed")
    assert Agent.objects.count() == 0
    client.get("/accounts/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/agents", "{}", content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201


def test_bearer_post_needs_no_csrf_token(owner_token):
    client = Client(enforce_csrf_checks=True)
    response = client.post(
        "/api/agents",
        "{}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {owner_token}"},
    )
    assert response.status_code == 201


def test_the_worker_is_woken_after_commit(api, django_capture_on_commit_callbacks):
    with (
        mock.patch("sessions.commands.base.wake_worker") as wake,
        django_capture_on_commit_callbacks(execute=True),
    ):
        body = api.post("/api/agents", {"prompt": "hi"}).json()
    woken = [c.args[0] for c in wake.call_args_list]
    assert [body["command"]] in woken and len(woken) == 2


def test_wake_worker_sends_to_the_worker_channel(settings):
    sent = []

    class Layer:
        async def send(self, channel, message):
            sent.append((channel, message))

    with mock.patch.object(wakeups, "get_channel_layer", return_value=Layer()):
        commands.wake_worker([7])
    assert sent == [(settings.ALINEO_WORKER_CHANNEL, {"type": "command.pending", "command": 7})]


def test_a_failing_wake_up_never_fails_the_request(api, django_capture_on_commit_callbacks):
    with (
        mock.patch.object(wakeups, "get_channel_layer", side_effect=RuntimeError("layer down")),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = api.post("/api/agents", {})
    assert response.status_code == 201
    assert Workspace.objects.count() == 1


def test_wake_up_reaches_the_worker_on_the_serving_loop(settings):
    """A sync view runs in a thread; the in-memory layer lives on daphne's loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    layer = InMemoryChannelLayer()
    try:
        with (
            mock.patch.object(wakeups, "get_channel_layer", return_value=layer),
            mock.patch.object(wakeups, "_loop", loop),
        ):
            commands.wake_worker([9])
        receive = asyncio.wait_for(layer.receive(settings.ALINEO_WORKER_CHANNEL), 5)
        message = asyncio.run_coroutine_threadsafe(receive, loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert message == {"type": "command.pending", "command": 9}


@pytest.mark.django_db(transaction=True)
def test_two_spawns_for_the_last_place_of_the_agents_quota_cannot_both_win(owner, workspace,
                                                                          monkeypatch):
    """The count and the insert happen under the workspace row's lock
    (sessions/commands/quotas.py): the second spawn counts after the first
    committed. Each spawn pauses between its count and its insert, waiting
    (bounded) for the other to get there too, which only a missing lock allows."""
    from django.db import connection

    from sessions.commands import quotas

    Workspace.objects.filter(pk=workspace.pk).update(max_agents=1)
    barrier = threading.Barrier(2, timeout=2)
    counted = quotas.capped_limits

    def after_the_count(*args, **kwargs):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass  # the other one waits for our lock: go on alone
        return counted(*args, **kwargs)

    monkeypatch.setattr(quotas, "capped_limits", after_the_count)
    outcomes: list[str] = []

    def spawn(i: int) -> None:
        try:
            outcomes.append(str(commands.spawn(owner, {"spec": {"model": "demo"}}, f"k{i}").status))
        except commands.CommandRefused as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=spawn, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["201", "quota.agents"], outcomes
    assert Agent.objects.count() == 1
