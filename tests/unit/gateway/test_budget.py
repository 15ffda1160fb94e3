"""Budgets per workspace and UTC day: set by an operator over the API (a
member reads it, an outsider gets a 404), refused at the gateway in the
caller's own error shape once today's model calls reach it, `budget.exceeded`
journaled once a turn, and the upstream — a fake server that counts requests —
not called for a refused call."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import anthropic
import openai
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from sessions import journal
from sessions.gateway import budget
from sessions.gateway.upstreams import OpenAIUpstream, Target
from sessions.models import Agent, ApiToken, Event, Workspace
from tests.unit.bridge.fake_models import openai_completion

from .conftest import anthropic_client, facts, openai_client, turn

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"openai:gpt-fake": {"input": 1000.0, "output": 1000.0}}  # 16 tokens: $0.016
ASK = [{"role": "user", "content": "list the files"}]


def set_budget(workspace, **values):
    Workspace.objects.filter(pk=workspace.pk).update(**values)


# --- at the gateway ---------------------------------------------------------------------


def test_a_token_budget_refuses_the_next_call_in_both_shapes(listen, fake, agent, workspace):
    set_budget(workspace, budget_tokens_per_day=20)
    turn(agent, 1)
    fake.script = [openai_completion(["first"])]  # 11 in + 5 out = 16 tokens: under 20
    sock = listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", "")))
    api = openai_client(sock)
    assert api.chat.completions.create(model="m", messages=ASK).choices[0].message.content == "first"
    fake.script = [openai_completion(["second"])]
    more = ASK + [{"role": "user", "content": "more"}]
    api.chat.completions.create(model="m", messages=more)  # 32 tokens now: over
    with pytest.raises(openai.RateLimitError) as refused:
        api.chat.completions.create(model="m", messages=more + [{"role": "user", "content": "x"}])
    body = refused.value.body
    assert body["code"] == "budget_exceeded" and body["message"].startswith("budget_exceeded:")
    assert "32 of 20 tokens" in body["message"]
    with pytest.raises(anthropic.RateLimitError) as again:
        anthropic_client(sock).messages.create(model="m", max_tokens=10, messages=[
            {"role": "user", "content": "another"}])
    assert again.value.body["type"] == "error"
    assert again.value.body["error"]["type"] == "rate_limit_error"
    assert len(fake.requests) == 2  # the refused calls never reached the upstream
    [exceeded] = facts(agent, "budget.exceeded")  # once a turn, however often refused
    assert exceeded.data == {"turn": 1, "limit": "tokens", "spent": 32, "budget": 20,
                             "day": datetime.now(timezone.utc).date().isoformat()}
    assert len(facts(agent, "model.call")) == 2


def test_a_cost_budget_counts_priced_calls_and_a_replay_is_still_answered(listen, fake, agent,
                                                                         workspace):
    set_budget(workspace, budget_usd_per_day=0.01)
    turn(agent, 1)
    fake.script = [openai_completion(["paid"])]
    api = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    api.chat.completions.create(model="m", messages=ASK)  # $0.016: over from now on
    # The same call again is answered from the journal: it costs nothing.
    assert api.chat.completions.create(model="m", messages=ASK).choices[0].message.content == "paid"
    with pytest.raises(openai.RateLimitError, match="USD"):
        api.chat.completions.create(model="m", messages=ASK + [{"role": "user", "content": "n"}])
    assert facts(agent, "budget.exceeded")[0].data["limit"] == "cost_usd"
    assert len(fake.requests) == 1 and len(facts(agent, "model.replayed")) == 1
    turn(agent, 2)
    with pytest.raises(openai.RateLimitError):
        api.chat.completions.create(model="m", messages=ASK + [{"role": "user", "content": "2"}])
    assert [e.data["turn"] for e in facts(agent, "budget.exceeded")] == [1, 2]


def test_no_budget_is_no_limit(listen, fake, agent):
    turn(agent, 1)
    fake.script = [openai_completion(["a"]), openai_completion(["b"])]
    api = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    api.chat.completions.create(model="m", messages=ASK)
    api.chat.completions.create(model="m", messages=ASK + [{"role": "user", "content": "b"}])
    assert facts(agent, "budget.exceeded") == [] and len(fake.requests) == 2


def test_spending_is_the_workspaces_and_todays_only(workspace, other_workspace, owner, outsider):
    mine = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    theirs = Agent.objects.create(workspace=other_workspace, created_by=outsider,
                                  spec={"model": "demo"})
    call = {"status": "ok", "usage": {"input_tokens": 7, "output_tokens": 3,
                                      "cache_read_tokens": 2, "cache_write_tokens": 0},
            "cost_usd": 0.5}
    journal.append(mine.id, "model.call", call)
    journal.append(mine.id, "model.call", {**call, "cost_usd": None})  # unpriced: tokens only
    journal.append(theirs.id, "model.call", call)
    spent = budget.spent_today(workspace.pk)
    assert (spent.calls, spent.tokens, spent.cost_usd) == (2, 24, 0.5)
    tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
    assert budget.spent_today(workspace.pk, tomorrow).calls == 0
    workspace.budget_tokens_per_day = 24
    assert budget.refusal(workspace).limit is budget.Limit.TOKENS
    assert budget.refusal(workspace, tomorrow) is None


# --- the API ----------------------------------------------------------------------------


URL = "/api/workspaces/acme/budget"


def bearer(user) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(user)[1]}"}


def put(client, user, body, url=URL):
    return client.put(url, data=json.dumps(body), content_type="application/json", **bearer(user))


def change_workspace(user):
    user.user_permissions.add(Permission.objects.get(codename="change_workspace",
                                                     content_type__app_label="agent_sessions"))
    return get_user_model().objects.get(pk=user.pk)


def test_an_operator_sets_the_budget_and_a_member_reads_it(client, owner, teammate, workspace):
    operator = change_workspace(owner)
    answer = put(client, operator, {"tokens_per_day": 5000, "usd_per_day": 2.5})
    assert answer.status_code == 200, answer.content
    body = client.get(URL, **bearer(teammate)).json()
    assert (body["tokens_per_day"], body["usd_per_day"]) == (5000, 2.5)
    assert body["today"]["tokens"] == 0 and body["exceeded"] is False
    assert put(client, operator, {"usd_per_day": None}).json()["usd_per_day"] is None
    workspace.refresh_from_db()
    assert (workspace.budget_tokens_per_day, workspace.budget_usd_per_day) == (5000, None)


def test_a_member_may_not_set_it_and_an_outsider_sees_no_workspace(client, owner, outsider,
                                                                 workspace):
    answer = put(client, owner, {"tokens_per_day": 10})
    assert answer.status_code == 403 and answer.json()["code"] == "budget.forbidden"
    for method in (client.get, lambda url, **kw: put(client, outsider, {"tokens_per_day": 1})):
        answer = method(URL, **bearer(outsider))
        assert answer.status_code == 404 and answer.json()["code"] == "workspace.not_found"
    assert client.get(URL).status_code == 401
    assert client.put(URL, data="{}", content_type="application/json").status_code == 401
    workspace.refresh_from_db()
    assert workspace.budget_tokens_per_day is None


@pytest.mark.parametrize("body, code", [
    ([1], "budget.invalid"),
    ({}, "budget.invalid"),
    ({"tokens": 5}, "budget.unknown_fields"),
    ({"tokens_per_day": 0}, "budget.tokens_per_day"),
    ({"tokens_per_day": 1.5}, "budget.tokens_per_day"),
    ({"tokens_per_day": True}, "budget.tokens_per_day"),
    ({"tokens_per_day": "100"}, "budget.tokens_per_day"),
    ({"tokens_per_day": 10**16}, "budget.tokens_per_day"),
    ({"usd_per_day": -1}, "budget.usd_per_day"),
    ({"usd_per_day": 0}, "budget.usd_per_day"),
    ({"usd_per_day": 1e12}, "budget.usd_per_day"),
    ({"tokens_per_day": 10, "usd_per_day": "cheap"}, "budget.usd_per_day"),
])
def test_bad_budgets_are_a_400_and_change_nothing(client, owner, workspace, body, code):
    answer = put(client, change_workspace(owner), body)
    assert answer.status_code == 400 and answer.json()["code"] == code, answer.content
    workspace.refresh_from_db()
    assert (workspace.budget_tokens_per_day, workspace.budget_usd_per_day) == (None, None)


def test_malformed_json_and_other_methods(client, owner):
    operator = change_workspace(owner)
    answer = client.put(URL, data="{nope", content_type="application/json", **bearer(operator))
    assert answer.status_code == 400 and answer.json()["code"] == "request.malformed_json"
    assert client.post(URL, data="{}", content_type="application/json",
                       **bearer(operator)).status_code == 405
    assert client.get("/api/workspaces/" + "x" * 101 + "/budget",
                      **bearer(operator)).status_code == 404


# --- the agent page -----------------------------------------------------------------------


def test_the_agent_page_shows_usage_per_turn_and_the_budget(client, owner, agent, workspace):
    set_budget(workspace, budget_tokens_per_day=10)
    for n in (1, 2):
        turn(agent, n)
        journal.append(agent.id, "model.call", {
            "turn": n, "provider": "openai:gpt-fake", "status": "ok", "cost_usd": 0.25,
            "usage": {"input_tokens": 4 * n, "output_tokens": 2, "cache_read_tokens": 0,
                      "cache_write_tokens": 0}})
    journal.append(agent.id, "budget.exceeded", {"turn": 2, "limit": "tokens", "spent": 14,
                                                 "budget": 10, "day": "2026-12-01"})
    client.force_login(owner)
    page = client.get(f"/agents/{agent.id}/").content.decode()
    assert "2 calls · 12 in / 4 out tokens · $0.500000" in page
    assert "<tr><td>2</td><td>1</td><td>8</td><td>2</td><td>$0.250000</td></tr>" in page
    assert "14 of 10 tokens" in page and "reached: model calls are refused" in page
    assert "Budget exceeded" in page
    assert Event.objects.filter(agent=agent, type="budget.exceeded").count() == 1


def test_the_gateway_reuses_the_days_spending_until_it_journals_a_call(workspace, agent,
                                                                      monkeypatch):
    monkeypatch.setattr(budget, "FRESH_S", 3600.0)
    workspace.budget_tokens_per_day = 10
    assert budget.refusal(workspace, reuse=True) is None  # read: nothing spent
    journal.append(agent.id, "model.call", {"status": "ok", "cost_usd": 0.0, "usage": {
        "input_tokens": 15, "output_tokens": 5}})      # another worker's call
    assert budget.refusal(workspace, reuse=True) is None  # not read again yet
    assert budget.refusal(workspace).spent == 20          # the API and admin always read
    budget.forget(workspace.pk)                           # this process journaled one
    assert budget.refusal(workspace, reuse=True).spent == 20
