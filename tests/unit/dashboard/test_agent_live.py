import pytest

from sessions import journal

pytestmark = pytest.mark.django_db


def test_anonymous_poll_is_sent_to_login(client, make_agent):
    agent = make_agent()
    response = client.get(f"/agents/{agent.id}/live?v=x", HTTP_HX_REQUEST="true",
                          HTTP_HX_CURRENT_URL=f"http://testserver/agents/{agent.id}/")
    assert response.status_code == 401 and "HX-Redirect" in response


def test_outsider_gets_404(client, outsider, make_agent):
    agent = make_agent()
    client.force_login(outsider)
    assert client.get(f"/agents/{agent.id}/live").status_code == 404


def test_poll_is_204_until_the_agent_changes(logged_in, make_agent):
    agent = make_agent()
    html = logged_in.get(f"/agents/{agent.id}/").content.decode()
    version = html.split('id="agent-live"')[1].split('data-version="')[1].split('"')[0]
    assert logged_in.get(f"/agents/{agent.id}/live?v={version}").status_code == 204
    journal.append(agent.id, "turn.started", {})
    response = logged_in.get(f"/agents/{agent.id}/live?v={version}")
    html = response.content.decode()
    assert response.status_code == 200 and "Running" in html
    assert 'id="side" class="side" hx-swap-oob="true"' in html
