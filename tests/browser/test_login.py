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


def test_five_failures_lock_the_client_out_with_a_clear_page(browser, server, new_page):
    """Through daphne (ASGI): django-axes' lockout page, then the same client's
    bearer token still works (tests/unit/dashboard/test_login_throttle.py has the rules)."""
    victim = server.create_actor("locked-victim")
    page = new_page()
    for _ in range(5):
        page.goto(f"{server.url}/accounts/login/")
        page.fill("#id_username", victim.username)
        page.fill("#id_password", "guess")
        with page.expect_response(lambda r: r.request.method == "POST") as answer:
            page.click("button[type=submit]")
    assert answer.value.status == 429 and answer.value.headers["retry-after"] == "900"
    assert "Too many failed logins" in page.locator("h1").inner_text()
    assert "15 minutes" in page.locator("main").inner_text()
    page.goto(f"{server.url}/accounts/login/")  # the right password is refused too, for now
    page.fill("#id_username", victim.username)
    page.fill("#id_password", f"{victim.username}-password-123")
    page.click("button[type=submit]")
    assert "Too many failed logins" in page.locator("h1").inner_text()
    api = page.request.get(f"{server.url}/api/agents", headers=victim.auth)
    assert api.status == 200
