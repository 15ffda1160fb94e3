"""The admin's workspace page sets the daily budget (docs/GATEWAY.md#budgets):
saved values are what GET /api/workspaces/{name}/budget reports and the
gateway holds calls to; empty is no budget; a value out of bounds is refused
with the field's message and changes nothing. Today's spending is shown."""

import pytest

from sessions import journal
from sessions.models import Workspace

from .test_admin_workspace_quotas import admin_client, change_url, post_change  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def test_the_page_has_the_budget_and_what_was_spent_today(admin_client, workspace, agent):
    journal.append(agent.id, "model.call", {"status": "ok", "cost_usd": 0.25, "usage": {
        "input_tokens": 30, "output_tokens": 12, "cache_read_tokens": 0, "cache_write_tokens": 0}})
    Workspace.objects.filter(pk=workspace.pk).update(budget_tokens_per_day=40)
    html = admin_client.get(change_url(workspace)).content.decode()
    assert 'name="budget_tokens_per_day"' in html and 'name="budget_usd_per_day"' in html
    assert "42 tokens, $0.2500 in 1 model calls" in html and "budget reached" in html


def test_a_budget_is_saved_and_emptied(admin_client, workspace):
    assert post_change(admin_client, workspace, budget_tokens_per_day=5000,
                 budget_usd_per_day="1.5").status_code == 302
    workspace.refresh_from_db()
    assert (workspace.budget_tokens_per_day, workspace.budget_usd_per_day) == (5000, 1.5)
    assert post_change(admin_client, workspace, budget_tokens_per_day="",
                 budget_usd_per_day="").status_code == 302
    workspace.refresh_from_db()
    assert (workspace.budget_tokens_per_day, workspace.budget_usd_per_day) == (None, None)


@pytest.mark.parametrize("field, value", [
    ("budget_tokens_per_day", 0), ("budget_tokens_per_day", 10**16),
    ("budget_usd_per_day", 0), ("budget_usd_per_day", -2), ("budget_usd_per_day", "lots")])
def test_a_budget_out_of_bounds_is_refused_and_changes_nothing(admin_client, workspace, field,
                                                              value):
    answer = post_change(admin_client, workspace, **{field: value})
    assert answer.status_code == 200 and "errorlist" in answer.content.decode()
    workspace.refresh_from_db()
    assert getattr(workspace, field) is None
