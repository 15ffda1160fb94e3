"""The agent list that scales (issue 15, Build 5), in a browser: typing in the
search narrows the list as you type (no reload, the URL follows), the status
filter brings the archived (ended) agents back, and paging moves through them."""

import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.live


def make_agents(server, actor, names_and_statuses) -> dict[str, str]:
    """Agents in the actor's workspace, in one shell: name -> id."""
    return server.django(
        "from django.contrib.auth import get_user_model\n"
        "from sessions import journal\n"
        "from sessions.models import Agent, Workspace\n"
        f"user = get_user_model().objects.get(pk={actor.user_id})\n"
        f"ws = Workspace.objects.get(name={actor.workspace!r})\n"
        "result = {}\n"
        f"for name, status in {names_and_statuses!r}:\n"
        "    a = Agent.objects.create(workspace=ws, created_by=user, spec={'model': 'demo', 'name': name})\n"
        "    journal.append_many(a.id, [('agent.spawned', {'spec': a.spec}),\n"
        "        ('message.user', {'turn': 1, 'text': 'say: ' + name + ' reporting'})])\n"
        "    if status != 'idle':\n"
        "        journal.append(a.id, 'agent.status', {'status': status, 'reason': 'test'})\n"
        "    result[name] = a.id\n"
    )


def rows(page) -> list[str]:
    return page.eval_on_selector_all("#agent-list tbody tr", "trs => trs.map(t => t.id.slice(5))")


def test_search_and_filter_the_agent_list(server, actor, page):
    ids = make_agents(server, actor, [("alpha-builder", "idle"), ("beta-tester", "idle"),
                                      ("alpha-old", "stopped"), ("gamma", "paused")])
    page.goto(f"{server.url}/agents/")
    page.locator(f"#list-{ids['gamma']}").wait_for()
    assert set(rows(page)) == {ids["alpha-builder"], ids["beta-tester"], ids["gamma"]}
    assert page.locator(f"#list-{ids['beta-tester']} .last-line").inner_text() == "say: beta-tester reporting"
    page.fill("#agent-q", "alpha")
    page.locator(f"#list-{ids['beta-tester']}").wait_for(state="detached")
    assert rows(page) == [ids["alpha-builder"]]
    assert "q=alpha" in page.url  # the search is in the URL: a reload or a link keeps it
    page.select_option("#agent-status", "archived")
    page.locator(f"#list-{ids['alpha-old']}").wait_for()
    assert rows(page) == [ids["alpha-old"]]
    screenshot(page, "agent-list")
    page.reload()
    assert rows(page) == [ids["alpha-old"]] and page.input_value("#agent-q") == "alpha"


def test_paging_through_the_agent_list(server, actor, page):
    make_agents(server, actor, [(f"pager-{i:02d}", "idle") for i in range(55)])
    page.goto(f"{server.url}/agents/?q=pager-")
    page.locator("#page-at", has_text="page 1 of 2").wait_for()
    first = rows(page)
    page.click("#page-next")
    page.locator("#page-at", has_text="page 2 of 2").wait_for()
    second = rows(page)
    assert len(first) == 50 and len(second) == 5 and not set(first) & set(second)


def test_the_tree_keeps_ended_agents_out_of_the_way(server, actor, page):
    ids = make_agents(server, actor, [("live-one", "idle"), ("ended-leaf", "stopped"),
                                      ("ended-parent", "stopped")])
    child = server.django(  # a live child under the ended parent keeps it in view
        "from sessions.models import Agent\n"
        f"p = Agent.objects.get(pk={ids['ended-parent']!r})\n"
        "result = Agent.objects.create(workspace=p.workspace, parent=p, spec={'model': 'demo'}).id\n")
    page.goto(f"{server.url}/")
    page.locator(f"#node-{ids['live-one']}").wait_for()
    assert page.locator(f"#node-{ids['ended-leaf']}").is_hidden()
    assert page.locator(f"#node-{ids['ended-parent']}").is_visible()
    assert page.locator(f"#node-{child}").is_visible()
    page.check("#show-archived")
    page.locator(f"#node-{ids['ended-leaf']}").wait_for(state="visible")
    page.reload()  # remembered
    page.locator(f"#node-{ids['ended-leaf']}").wait_for(state="visible")
    page.uncheck("#show-archived")
    page.locator(f"#node-{ids['ended-leaf']}").wait_for(state="hidden")
