"""The live home in a browser (issue 15, Build 6): an agent writes a file in
a turn that is still running; on its Files page *Look at the live home*
waits for the worker's copy (the page reloads itself) and shows the file,
labelled live."""

import time

import httpx
import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.live


def _wait_write(server, actor, agent: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        events = httpx.get(f"{server.url}/api/agents/{agent}/events?after=0&limit=500",
                           headers=actor.auth, timeout=30).json()["events"]
        if any(e["type"] == "tool.result" for e in events):
            return
        time.sleep(0.2)
    raise AssertionError("the agent did not write its file")


def test_look_at_the_live_home_of_a_running_agent(server, actor, page):
    r = httpx.post(f"{server.url}/api/agents", headers=actor.auth, timeout=30, json={
        "spec": {"model": "demo"}, "prompt": "write live.txt: seen live\nsleep: 60"})
    assert r.status_code == 201, r.text
    agent = r.json()["id"]
    try:
        _wait_write(server, actor, agent)
        page.goto(f"{server.url}/agents/{agent}/files")
        page.click("#look-button")
        page.locator("#live-label").wait_for(timeout=60_000)
        page.click("#dir-list >> text=live.txt")
        assert page.locator("#file-view").inner_text().strip() == "seen live"
        assert "Live, taken at" in page.locator("#live-label").inner_text()
        screenshot(page, "files-live")
    finally:
        httpx.post(f"{server.url}/api/agents/{agent}/stop", headers=actor.auth, json={},
                   timeout=30)
