"""Usage (issue 15, Build 7): tokens and cost per turn in the transcript's
turn blocks (from the sum the relay puts on turn.finished / turn.interrupted),
and per workspace and agent over the last days on /usage, from the gateway's
model.call facts. Workspace-scoped; bad input a readable page."""

from __future__ import annotations

import re

import pytest

from sessions.gateway.usage import usage_line

pytestmark = pytest.mark.django_db


def call(turn, tin, tout, cost=0.0001):
    data = {"turn": turn, "provider": "openai", "model": "m",
            "usage": {"input_tokens": tin, "output_tokens": tout}, "latency_ms": 5}
    if cost is not None:
        data["cost_usd"] = cost
    return ("model.call", data)


USAGE_1 = {"calls": 2, "input_tokens": 120, "output_tokens": 40, "cache_read_tokens": 0,
           "cache_write_tokens": 0, "cost_usd": 0.0003, "unpriced_calls": 0}


def test_the_usage_line_is_bounded_to_what_it_can_trust():
    assert usage_line(USAGE_1) == "2 model calls · 120 in / 40 out tokens · $0.000300"
    assert usage_line({"calls": 0}) == "" and usage_line(None) == "" and usage_line("x") == ""
    assert usage_line({"calls": 1, "input_tokens": -5, "output_tokens": True, "cost_usd": "9",
                       "unpriced_calls": 1}) == "1 model call · 0 in / 0 out tokens · 1 without a price"


def test_a_turn_block_says_what_its_turn_cost(client, owner, make_agent):
    agent = make_agent(facts=[("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
                              call(1, 100, 30, 0.0002), call(1, 20, 10),
                              ("turn.finished", {"turn": 1, "usage": USAGE_1}),
                              ("turn.started", {"turn": 2}),
                              ("turn.interrupted", {"turn": 2, "reason": "x", "usage": {"calls": 0}})])
    client.force_login(owner)
    html = client.get(f"/agents/{agent.id}/").content.decode()
    assert '<span class="small turn-usage">2 model calls · 120 in / 40 out tokens · $0.000300</span>' in html
    assert html.count('class="small turn-usage"') == 1  # turn 2 made no call: nothing said


def test_usage_per_workspace_and_agent(client, owner, make_agent, other_workspace):
    cheap = make_agent(facts=[call(1, 10, 5, 0.0001)])
    dear = make_agent(facts=[call(1, 1000, 500, 0.02), call(2, 10, 10, None)])
    foreign = make_agent(facts=[call(1, 7, 7, 5.0)], ws=other_workspace)
    client.force_login(owner)
    html = client.get("/usage").content.decode()
    assert re.findall(r'<tr id="usage-(ag_[0-9a-f]+)"', html) == [dear.id, cheap.id]  # dearest first
    assert "3 calls · 1020 in / 515 out tokens" in html and "$0.020100" in html
    assert "(1 without a price)" in html
    assert foreign.id not in html and "$5.0" not in html


@pytest.mark.parametrize("days", ["0", "31", "-1", "abc", "%C2%B2", "9" * 50, "%00"])
def test_bad_days_fall_back_and_say_so(client, owner, days):
    client.force_login(owner)
    response = client.get(f"/usage?days={days}")
    assert response.status_code == 200 and b"Days must be a whole number" in response.content


def test_strangers_go_to_the_login(client):
    assert client.get("/usage").status_code == 302
    assert client.post("/usage").status_code in (302, 405)
