"""Bug 6 of the operator's console (issue 15): Steer and Interrupt only while a
turn runs, the same rule in the tree and on the agent page; Stop asks first;
Pause says the current step finishes first."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db

RUNNING = [("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
           ("message.user", {"turn": 1, "text": "sleep: 5"})]
IDLE = RUNNING + [("turn.finished", {"turn": 1, "text": ""})]


def buttons(html: str, agent_id: str) -> set[str]:
    """The verbs offered for one agent (ids like steer-open-<id>, interrupt-<id>)."""
    found = set(re.findall(rf'id="(prompt|steer|interrupt|pause|resume|stop)(?:-open)?-{agent_id}"', html))
    return found


def node_html(html: str, agent_id: str) -> str:
    start = html.index(f'id="node-{agent_id}"')
    return html[start:html.index("</li>", start)]


@pytest.mark.parametrize("facts,expected", [
    (IDLE, {"prompt", "pause", "stop"}),
    (RUNNING, {"prompt", "steer", "interrupt", "pause", "stop"}),
])
def test_the_tree_and_the_agent_page_offer_the_same_verbs(logged_in, make_agent, facts, expected):
    agent = make_agent(facts=facts)
    page = logged_in.get(f"/agents/{agent.id}/").content.decode()
    actions = page[page.index(f'id="actions-{agent.id}"'):page.index('id="stream-banner"')]
    tree = node_html(logged_in.get("/").content.decode(), agent.id)
    assert buttons(actions, agent.id) == expected
    assert buttons(tree, agent.id) == expected


def test_stop_asks_for_confirmation_first(logged_in, make_agent):
    agent = make_agent(facts=IDLE)
    for html in (logged_in.get(f"/agents/{agent.id}/").content.decode(),
                 node_html(logged_in.get("/").content.decode(), agent.id)):
        # The Stop button sits inside a closed <details> opened by "Stop…", with a warning.
        details = html[html.index(f'id="stop-open-{agent.id}"') - 200:]
        assert "<details" in details[:200]
        confirm = details[:details.index("</details>")]
        assert f'id="stop-{agent.id}"' in confirm
        assert "transcript and checkpoints stay" in confirm


def test_pause_says_the_current_step_finishes_first(logged_in, make_agent):
    agent = make_agent(facts=RUNNING)
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    assert "current step finishes first" in html
    response = logged_in.post(f"/agents/{agent.id}/pause", HTTP_HX_REQUEST="true")
    assert "current step finishes first" in response.content.decode()


def test_the_live_poll_redraws_the_buttons_when_a_turn_starts(logged_in, make_agent):
    from sessions import journal

    agent = make_agent(facts=IDLE)
    assert "steer" not in buttons(logged_in.get(f"/agents/{agent.id}/").content.decode(), agent.id)
    journal.append_many(agent.id, [("turn.started", {"turn": 2})])
    live = logged_in.get(f"/agents/{agent.id}/live").content.decode()
    actions = live[live.index(f'id="actions-{agent.id}"') - 80:]
    assert 'hx-swap-oob="true"' in actions[:200]
    assert buttons(actions, agent.id) == {"prompt", "steer", "interrupt", "pause", "stop"}
