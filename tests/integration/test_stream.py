"""The SSE transcript stream against real server processes.

Every fact here is written by *another process* (`manage.py note` or a shell):
with the in-memory channel layer only the server's data_version watcher can
carry such a commit to an open stream. The module's server has a heartbeat far
longer than any wait below, so an event that arrives was delivered by a
wake-up, not by the heartbeat's safety re-read (that one has its own test).
"""

from __future__ import annotations

import http.client
import json

import pytest

from tests.live import SSEStream

pytestmark = pytest.mark.live

LIVE_SERVER_ENV = {"ALINEO_SSE_HEARTBEAT_S": "600"}
WAIT = 10.0  # seconds to wait for something that must arrive


@pytest.fixture(scope="module")
def olivia(alineo_server):
    return alineo_server.create_actor("olivia", "acme")


@pytest.fixture(scope="module")
def oscar(alineo_server):
    return alineo_server.create_actor("oscar", "globex")


@pytest.fixture(scope="module")
def olivias_agent(alineo_server, olivia):
    """An agent for tests that only look at refusals (one shell call for all of them)."""
    return alineo_server.create_agent(olivia, [("message.user", {"text": "hello"})])


def facts(n: int, start: int = 1) -> list[tuple[str, dict]]:
    return [("message.user", {"text": f"fact {i}"}) for i in range(start, start + n)]


def stream_url(server, agent_id: str, query: str = "") -> str:
    return f"{server.url}/api/agents/{agent_id}/stream{query}"


def seqs(events) -> list[int]:
    return [int(e.id) for e in events]


def assert_consistent(event):
    """id, event name and the JSON payload must agree."""
    body = event.json()
    assert set(body) == {"seq", "type", "ts", "data"}
    assert str(body["seq"]) == event.id
    assert body["type"] == event.event
    assert body["ts"].endswith("Z")


# --- delivery -------------------------------------------------------------------------

def test_backlog_then_live_events_in_order(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia, facts(3))
    with SSEStream(stream_url(alineo_server, agent), olivia.auth, WAIT) as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-cache"
        assert stream.headers["x-accel-buffering"] == "no"
        backlog = stream.events(3)
        assert stream.retry == 1000
        assert seqs(backlog) == [1, 2, 3]
        assert [e.json()["data"]["text"] for e in backlog] == ["fact 1", "fact 2", "fact 3"]
        for event in backlog:
            assert_consistent(event)

        seq = alineo_server.note(agent, "from another process")
        live = stream.next_event()
        assert (int(live.id), live.event) == (seq, "operator.note") == (4, "operator.note")
        assert live.json()["data"] == {"text": "from another process"}


@pytest.mark.parametrize("how", ["last-event-id", "after"])
def test_reconnect_mid_stream_has_no_gap_and_no_duplicate(alineo_server, olivia, how):
    agent = alineo_server.create_agent(olivia, facts(5))
    with SSEStream(stream_url(alineo_server, agent), olivia.auth, WAIT) as first:
        seen = first.events(3)  # leave mid-backlog: 4 and 5 were sent or are in flight
    assert seqs(seen) == [1, 2, 3]

    # Facts committed while no stream is open.
    alineo_server.note(agent, "while away 1")
    alineo_server.note(agent, "while away 2")

    cursor = seen[-1].id
    headers, query = dict(olivia.auth), ""
    if how == "last-event-id":
        headers["Last-Event-ID"] = cursor
    else:
        query = f"?after={cursor}"
    with SSEStream(stream_url(alineo_server, agent, query), headers, WAIT) as second:
        resumed = second.events(4)
        assert seqs(resumed) == [4, 5, 6, 7]
        # Once at the head, the next thing on the wire is the next fact, not a repeat.
        alineo_server.note(agent, "after resume")
        assert seqs([second.next_event()]) == [8]
    all_seen = seqs(seen + resumed) + [8]
    assert all_seen == list(range(1, 9))


def test_last_event_id_wins_over_after(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia, facts(4))
    headers = {**olivia.auth, "Last-Event-ID": "3"}
    with SSEStream(stream_url(alineo_server, agent, "?after=1"), headers, WAIT) as stream:
        assert seqs([stream.next_event()]) == [4]


def test_two_streams_on_one_agent_receive_the_same_sequence(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia, facts(2))
    url = stream_url(alineo_server, agent)
    with SSEStream(url, olivia.auth, WAIT) as a, SSEStream(url, olivia.auth, WAIT) as b:
        got_a, got_b = a.events(2), b.events(2)
        for i in range(3):
            alineo_server.note(agent, f"live {i}")
        got_a += a.events(3)
        got_b += b.events(3)
    assert seqs(got_a) == [1, 2, 3, 4, 5]
    assert [(e.id, e.event, e.data) for e in got_a] == [(e.id, e.event, e.data) for e in got_b]


def test_a_stream_only_gets_its_own_agents_events(alineo_server, olivia):
    mine = alineo_server.create_agent(olivia)
    other = alineo_server.create_agent(olivia)
    with SSEStream(stream_url(alineo_server, mine), olivia.auth, WAIT) as stream:
        alineo_server.note(other, "not for this stream")
        alineo_server.note(mine, "for this stream")
        event = stream.next_event()
    assert (event.id, event.json()["data"]["text"]) == ("1", "for this stream")


def test_browser_session_may_stream(alineo_server, olivia, olivias_agent):
    agent = olivias_agent
    cookie = alineo_server.session_cookie(olivia)
    with SSEStream(stream_url(alineo_server, agent), {"Cookie": f"sessionid={cookie}"}, WAIT) as stream:
        assert stream.status == 200
        assert seqs([stream.next_event()]) == [1]


# --- cursors ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["after", "last-event-id"])
def test_cursor_beyond_head_resets_and_keeps_streaming(alineo_server, olivia, where):
    agent = alineo_server.create_agent(olivia, facts(2))
    headers, query = dict(olivia.auth), ""
    if where == "after":
        query = "?after=50"
    else:
        headers["Last-Event-ID"] = "50"
    with SSEStream(stream_url(alineo_server, agent, query), headers, WAIT) as stream:
        reset = stream.next_event()
        assert reset.event == "reset"
        assert reset.json() == {"head": 2, "reason": "cursor_beyond_head"}
        assert reset.id == "2"  # a reconnecting client resumes from the head
        alineo_server.note(agent, "after the reset")
        assert seqs([stream.next_event()]) == [3]


def test_cursor_at_head_waits_for_the_next_fact(alineo_server, olivia):
    agent = alineo_server.create_agent(olivia, facts(2))
    with SSEStream(stream_url(alineo_server, agent, "?after=2"), olivia.auth, WAIT) as stream:
        alineo_server.note(agent, "next")
        event = stream.next_event()
    assert (event.id, event.event) == ("3", "operator.note")


@pytest.mark.parametrize(
    "query, headers",
    [
        ("?after=abc", {}),
        ("?after=-1", {}),
        ("?after=1.5", {}),
        ("?after=", {}),
        ("?after=%C2%B2", {}),  # a unicode digit is not a cursor
        ("", {"Last-Event-ID": "x7"}),
        ("", {"Last-Event-ID": "-3"}),
        ("?after=1", {"Last-Event-ID": "nope"}),
    ],
)
def test_bad_cursor_is_400(alineo_server, olivia, olivias_agent, query, headers):
    agent = olivias_agent
    status, body = request(alineo_server, "GET", f"/api/agents/{agent}/stream{query}", {**olivia.auth, **headers})
    assert status == 400
    assert body["code"] == "cursor.invalid"
    assert body["message"]


# --- who may look -----------------------------------------------------------------------

def request(server, method: str, path: str, headers: dict[str, str]):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        assert resp.getheader("Content-Type", "").startswith("application/json")
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_anonymous_is_401(alineo_server, olivias_agent):
    agent = olivias_agent
    for headers in ({}, {"Authorization": "Bearer aln_not-a-token"}, {"Authorization": "Basic eDp5"}):
        status, body = request(alineo_server, "GET", f"/api/agents/{agent}/stream", headers)
        assert status == 401, headers
        assert set(body) >= {"code", "message"}


def test_outsider_and_unknown_agent_are_404(alineo_server, olivia, oscar, olivias_agent):
    agent = olivias_agent
    status, body = request(alineo_server, "GET", f"/api/agents/{agent}/stream", oscar.auth)
    assert (status, body["code"]) == (404, "agent.not_found")
    status, body = request(alineo_server, "GET", "/api/agents/ag_0000000000000000/stream", olivia.auth)
    assert (status, body["code"]) == (404, "agent.not_found")


def test_other_methods_are_405(alineo_server, olivia, olivias_agent):
    agent = olivias_agent
    for method in ("POST", "PUT", "DELETE"):
        status, body = request(alineo_server, method, f"/api/agents/{agent}/stream", olivia.auth)
        assert status == 405, method
        assert set(body) >= {"code", "message"}


# --- surviving the server ------------------------------------------------------------------

def test_resume_after_server_restart(alineo_server_factory):
    server = alineo_server_factory({"ALINEO_SSE_HEARTBEAT_S": "600"})
    actor = server.create_actor("rita")
    agent = server.create_agent(actor, facts(2))
    with SSEStream(stream_url(server, agent), actor.auth, WAIT) as stream:
        before = stream.events(2)
    server.restart(hard=True)  # a crash: no shutdown code runs
    server.note(agent, "after the crash")
    headers = {**actor.auth, "Last-Event-ID": before[-1].id}
    with SSEStream(stream_url(server, agent), headers, WAIT) as stream:
        after = stream.next_event()
    assert seqs(before) + seqs([after]) == [1, 2, 3]


# --- heartbeat -------------------------------------------------------------------------------

def test_heartbeat_arrives_and_its_reread_delivers_without_wakeups(alineo_server_factory):
    # The data_version watcher looks once at start and then once an hour here
    # (ALINEO_DATA_VERSION_POLL_S), and the in-memory layer does not cross
    # processes, so a commit by another process can only reach the stream
    # through the heartbeat's safety re-read (sessions/api/tails.py): without
    # that re-read, this event never arrives.
    server = alineo_server_factory({"ALINEO_SSE_HEARTBEAT_S": "0.3",
                                    "ALINEO_DATA_VERSION_POLL_S": "3600"})
    actor = server.create_actor("hana")
    agent = server.create_agent(actor)
    with SSEStream(stream_url(server, agent), actor.auth, WAIT) as stream:
        stream.wait_comment("ka")
        server.note(agent, "found by the safety re-read")
        event = stream.next_event()
    assert (event.id, event.event) == ("1", "operator.note")
