import pytest

from sessions.models import Agent

pytestmark = pytest.mark.django_db


def test_anonymous_is_sent_to_login_and_back(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/")


def test_owner_sees_the_tree_of_their_workspace_only(client, owner, workspace, other_workspace, outsider):
    root = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    child = Agent.objects.create(workspace=workspace, parent=root, spec={"model": "demo"})
    foreign = Agent.objects.create(workspace=other_workspace, spec={"model": "demo"})
    client.force_login(owner)
    html = client.get("/").content.decode()
    assert root.id in html and child.id in html and foreign.id not in html
    # the child is drawn inside its parent's list item
    assert html.index(root.id) < html.index(child.id)
    assert html.count('<ul class="tree">') == 1 and "<ul>" in html


def test_teammate_sees_the_same_agents(client, teammate, workspace):
    agent = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    client.force_login(teammate)
    assert agent.id in client.get("/").content.decode()


def test_login_page_renders(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200 and b"Log in" in response.content
