import pytest

from sessions import journal

pytestmark = pytest.mark.django_db


def test_anonymous_fragment_gets_hx_redirect_to_login_and_back(client):
    response = client.get("/tree?v=x", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/")
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/accounts/login/?next=/"


def test_unchanged_tree_answers_204_and_a_change_redraws(logged_in, make_agent):
    agent = make_agent()
    page = logged_in.get("/").content.decode()
    version = page.split('data-version="')[1].split('"')[0]
    assert logged_in.get(f"/tree?v={version}").status_code == 204
    journal.append(agent.id, "turn.started", {})
    response = logged_in.get(f"/tree?v={version}")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith("{#") is False and 'id="tree"' in html
    assert "Running" in html and f'data-version="{version}"' not in html


def test_the_fragment_is_the_same_template_as_the_page(logged_in, make_agent):
    make_agent()
    page = logged_in.get("/")
    fragment = logged_in.get("/tree")
    assert "sessions/_tree.html" in [t.name for t in page.templates]
    assert fragment.templates[0].name == "sessions/_tree.html"


def test_outsider_fragment_shows_nothing_of_others(client, outsider, make_agent):
    agent = make_agent()
    client.force_login(outsider)
    assert agent.id not in client.get("/tree").content.decode()


def test_the_page_draws_each_workspace_with_its_cursor_and_does_not_poll(logged_in, make_agent):
    agents = [make_agent() for _ in range(2)]
    journal.append(agents[0].id, "turn.started", {})
    html = logged_in.get("/").content.decode()
    seq = sum(a.last_seq for a in type(agents[0]).objects.filter(pk__in=[a.id for a in agents]))
    assert f'data-cursor="{seq}"' in html and seq > 0
    assert 'data-stream-url="/api/workspaces/acme/stream"' in html
    assert "every 2s" not in html.split('id="tree"')[1]  # live over SSE, not polled
