"""Change a workspace's retention in the admin: over 30 days is refused with a
clear message; a shorter one is saved."""

import pytest

from .conftest import screenshot

pytestmark = pytest.mark.live


def test_retention_over_30_days_is_refused(server, actor, new_page):
    data = server.django(
        "from django.contrib.auth import get_user_model\n"
        "from sessions.models import Workspace\n"
        "get_user_model().objects.create_superuser('boss', password='boss-password-123')\n"
        f"result = Workspace.objects.get(name={actor.workspace!r}).pk\n"
    )
    page = new_page()
    page.goto(f"{server.url}/admin/agent_sessions/workspace/{data}/change/")
    page.fill("#id_username", "boss")
    page.fill("#id_password", "boss-password-123")
    page.click("input[type=submit], button[type=submit]")
    page.locator("#id_checkpoint_max_age_days").wait_for()

    page.fill("#id_checkpoint_max_age_days", "45")
    page.click("input[name=_continue]")
    error = page.locator(".field-checkpoint_max_age_days .errorlist")
    error.wait_for()
    assert "at most 30 days; 45 is too long" in error.inner_text()
    screenshot(page, "admin-retention")

    page.fill("#id_checkpoint_max_age_days", "7")
    page.click("input[name=_continue]")
    page.locator(".messagelist .success").wait_for()
    assert page.locator("#id_checkpoint_max_age_days").input_value() == "7"
    assert "Older than 7 days" in page.locator(".sweep-effect").inner_text()
