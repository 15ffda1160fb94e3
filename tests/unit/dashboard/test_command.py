import pytest

from sessions.models import Command

pytestmark = pytest.mark.django_db


def test_anonymous_post_goes_to_login(client, make_agent):
    agent = make_agent()
    response = client.post(f"/agents/{agent.id}/pause")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")
    response = client.post(f"/agents/{agent.id}/pause", HTTP_HX_REQUEST="true",
                           HTTP_HX_CURRENT_URL=f"http://testserver/agents/{agent.id}/")
    assert response.status_code == 401
    assert response["HX-Redirect"] == f"/accounts/login/?next=/agents/{agent.id}/"
    assert not Command.objects.exists()


def test_outsider_gets_404_and_nothing_happens(client, outsider, make_agent):
    agent = make_agent()
    client.force_login(outsider)
    assert client.post(f"/agents/{agent.id}/stop").status_code == 404
    assert not Command.objects.exists()


def test_teammate_prompts_through_the_same_command_as_the_api(client, teammate, make_agent):
    agent = make_agent()
    client.force_login(teammate)
    response = client.post(f"/agents/{agent.id}/prompt", {"text": "say: hi"},
                           HTTP_HX_REQUEST="true", HTTP_IDEMPOTENCY_KEY="k-1")
    assert response.status_code == 200 and "Prompt sent" in response.content.decode()
    cmd = Command.objects.get()
    assert cmd.verb == "prompt" and cmd.idempotency_key == "k-1" and cmd.user == teammate
    assert agent.events.filter(type="command.prompt", data__text="say: hi").exists()


def test_double_click_acts_once(logged_in, make_agent):
    agent = make_agent()
    for _ in range(2):
        response = logged_in.post(f"/agents/{agent.id}/pause", {"idempotency_key": "k-dbl"},
                                  HTTP_HX_REQUEST="true")
    assert "already sent by this click" in response.content.decode()
    assert Command.objects.filter(verb="pause").count() == 1
    assert agent.events.filter(type="command.pause").count() == 1


def test_empty_prompt_is_refused_next_to_the_field(logged_in, make_agent):
    agent = make_agent()
    response = logged_in.post(f"/agents/{agent.id}/prompt", {"text": "  "}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 400
    assert f'id="prompt-err-{agent.id}"' in html and "cannot be empty" in html
    assert 'aria-invalid="true"' in html and " open>" in html
    assert not Command.objects.exists()


def test_command_on_a_stopped_agent_explains_why(logged_in, make_agent):
    agent = make_agent(status="stopped")
    response = logged_in.post(f"/agents/{agent.id}/resume", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 409
    assert "is stopped" in html and "spawn or fork a new agent" in html
    assert "Stopped: commands cannot run" in html


def test_command_on_a_lost_agent_explains_why_without_js(logged_in, make_agent):
    agent = make_agent(status="lost")
    response = logged_in.post(f"/agents/{agent.id}/prompt", {"text": "hi"}, follow=True)
    assert "is lost and could not be brought back" in response.content.decode()


def test_without_js_a_command_redirects_back_with_a_message(logged_in, make_agent):
    agent = make_agent()
    response = logged_in.post(f"/agents/{agent.id}/pause", {"next": "/"}, follow=True)
    assert response.redirect_chain[-1][0] == "/" and "Pause sent" in response.content.decode()


def test_next_may_not_leave_the_site(logged_in, make_agent):
    agent = make_agent()
    response = logged_in.post(f"/agents/{agent.id}/pause", {"next": "https://evil.example/"})
    assert response["Location"] == f"/agents/{agent.id}/"


def test_pause_then_resume_swaps_the_button(logged_in, make_agent):
    agent = make_agent()
    html = logged_in.post(f"/agents/{agent.id}/pause", HTTP_HX_REQUEST="true").content.decode()
    assert f'id="resume-{agent.id}"' in html and f'id="pause-{agent.id}"' not in html


def test_get_is_not_allowed(logged_in, make_agent):
    agent = make_agent()
    assert logged_in.get(f"/agents/{agent.id}/pause").status_code == 405
