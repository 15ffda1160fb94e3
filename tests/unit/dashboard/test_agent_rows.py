import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def long_agent(make_agent):
    return make_agent(facts=[("operator.note", {"text": f"n{i}"}) for i in range(1, 701)])


def test_anonymous_fragment_is_sent_to_login(client, long_agent):
    response = client.get(f"/agents/{long_agent.id}/rows?after=0",
                          HTTP_X_ALINEO_FRAGMENT="1",
                          HTTP_HX_CURRENT_URL=f"http://testserver/agents/{long_agent.id}/")
    assert response.status_code == 401
    assert response["HX-Redirect"] == f"/accounts/login/?next=/agents/{long_agent.id}/"


def test_outsider_gets_404(client, outsider, long_agent):
    client.force_login(outsider)
    assert client.get(f"/agents/{long_agent.id}/rows?after=0").status_code == 404


def test_after_gives_the_rows_following_the_cursor(logged_in, long_agent):
    response = logged_in.get(f"/agents/{long_agent.id}/rows?after=650")
    html = response.content.decode()
    assert 'id="row-651"' in html and 'id="row-700"' in html and 'id="row-650"' not in html
    assert response["X-Alineo-Last"] == "700" and response["X-Alineo-Has-More"] == "0"
    assert response.templates[0].name == "sessions/_event_rows.html"


def test_before_pages_backwards_to_the_start(logged_in, long_agent):
    seen, before = [], 401
    while True:
        response = logged_in.get(f"/agents/{long_agent.id}/rows?before={before}")
        first = int(response["X-Alineo-First"])
        seen.append(first)
        if response["X-Alineo-Has-More"] == "0":
            break
        before = first
    assert seen == [101, 1]


def test_teammate_reads_rows(client, teammate, long_agent):
    client.force_login(teammate)
    assert client.get(f"/agents/{long_agent.id}/rows?after=699").status_code == 200


@pytest.mark.parametrize("query", ["", "?after=x", "?after=1&before=5", "?before=-1"])
def test_bad_cursor_is_a_400_not_a_trace(logged_in, long_agent, query):
    response = logged_in.get(f"/agents/{long_agent.id}/rows{query}")
    assert response.status_code == 400 and b"Traceback" not in response.content
