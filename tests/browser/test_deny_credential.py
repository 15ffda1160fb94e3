"""Deny a held credential from the agent page (issue 15, Build 2): an operator
opens Deny…, says why, and the agent ends as lost with who and why in its
transcript; the approval box goes. The server's own worker acts on it."""

import httpx
import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.live

HOLD = {"model": "demo", "credentials": [{"name": "deploy-token", "env": "DEPLOY", "approval": "hold"}]}


def test_an_operator_denies_a_held_credential_and_the_agent_ends_lost(server, actor, page):
    server.grant(actor)
    server.django(
        "from sessions.models import Workspace\nfrom sessions.credentials import set_secret\n"
        f"set_secret(Workspace.objects.get(name={actor.workspace!r}), 'deploy-token', 'not-shown')\n")
    r = httpx.post(f"{server.url}/api/agents", json={"spec": HOLD, "prompt": "say: hi"},
                   headers=actor.auth, timeout=30)
    assert r.status_code == 201, r.text
    agent = r.json()["id"]
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#approval", has_text="deploy-token").wait_for(timeout=30_000)
    page.click(f"#deny-open-{agent}")
    page.fill(f"#deny-reason-{agent}", "no deploys on Fridays")
    screenshot(page, "deny-credential")
    page.click(f"#deny-{agent}")
    page.locator(".note", has_text="ends as lost").first.wait_for()
    # The worker ends it: the header says Lost, with the denial as the reason.
    page.locator("#agent-live .reason", has_text="no deploys on Fridays").wait_for(timeout=30_000)
    page.locator("#agent-live", has_text="Lost").wait_for()
    assert page.locator("#approval").count() == 0
    assert page.locator("#rows li", has_text=f"deploy-token by {actor.username}").count() >= 1
    assert "not-shown" not in page.content()
