"""Log in through the form and land back where you were going."""

import pytest

pytestmark = pytest.mark.live


def test_login_and_back(browser, server, actor, new_page):
    agent = server.create_agent(actor, [("operator.note", {"text": "hello"})])
    page = new_page()
    page.goto(f"{server.url}/agents/{agent}/")
    assert "/accounts/login/" in page.url and f"next=/agents/{agent}/" in page.url
    page.fill("#id_username", actor.username)
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    assert page.locator(".field-error").first.is_visible()
    page.fill("#id_username", actor.username)
    page.fill("#id_password", f"{actor.username}-password-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/agents/{agent}/")
    page.locator("#row-1").wait_for()
    assert "hello" in page.locator("#row-1").inner_text()
