"""Usage (issue 15, Build 7), in a browser: a turn's block says what its model
calls cost, and Usage in the header lists the agent with its sums and links to it."""

import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.live

CALL = {"turn": 1, "provider": "openai", "model": "m", "latency_ms": 9, "cost_usd": 0.0125,
        "usage": {"input_tokens": 1500, "output_tokens": 300}}
SUM = {"calls": 1, "input_tokens": 1500, "output_tokens": 300, "cost_usd": 0.0125, "unpriced_calls": 0}


def test_per_turn_figures_and_the_usage_page(server, actor, page):
    agent = server.create_agent(actor, [
        ("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
        ("message.user", {"turn": 1, "text": "say: hi"}), ("model.call", CALL),
        ("message.assistant", {"turn": 1, "text": "hi"}), ("turn.finished", {"turn": 1, "usage": SUM})])
    page.goto(f"{server.url}/agents/{agent}/")
    usage = page.locator("#rows li[data-type='turn.finished'] .turn-usage")
    assert usage.inner_text() == "1 model call · 1500 in / 300 out tokens · $0.012500"
    page.click("header.top >> text=Usage")
    row = page.locator(f"#usage-{agent}")
    assert "1500 / 300" in row.inner_text() and "$0.012500" in row.inner_text()
    screenshot(page, "usage")
    row.locator("a").click()
    page.wait_for_url(f"**/agents/{agent}/")
