"""The numbered event outbox: cursors, acknowledgements, long-poll, restarts."""

from __future__ import annotations

from .harness import types


def test_paging_from_a_cursor_has_no_gap_and_no_duplicate(make_bridge):
    client = make_bridge().client
    everything = client.run_turn("write a.txt: x\nrun: true")
    head = everything[-1]["bseq"]

    paged, cursor = [], 0
    while cursor < head:
        page = client.events(cursor, limit=3)  # a new connection each time
        assert page and len(page) <= 3
        paged += page
        cursor = page[-1]["bseq"]
    assert [e["bseq"] for e in paged] == list(range(1, head + 1))
    assert paged == everything


def test_ack_drops_events_and_old_cursors_are_refused(make_bridge):
    bridge = make_bridge()
    client = bridge.client
    events = client.run_turn("say: hi")
    head = events[-1]["bseq"]
    assert client.ok("ack", through=3)["acked"] == 3

    assert [e["bseq"] for e in client.events(3)] == list(range(4, head + 1))
    pruned = client.call("events", after=2)["error"]
    assert (pruned["code"], pruned["acked"]) == ("cursor_pruned", 3)
    ahead = client.call("events", after=head + 5)["error"]
    assert (ahead["code"], ahead["head"]) == ("cursor_ahead", head)
    assert client.call("ack", through=head + 1)["error"]["code"] == "bad_ack"
    assert [e["bseq"] for e in bridge.session()["outbox"]] == list(range(4, head + 1))


def test_long_poll_returns_empty_after_its_wait_and_wakes_on_news(make_bridge):
    client = make_bridge().client
    head = client.ok("status")["head"]
    empty = client.ok("events", after=head, wait=0.2)
    assert empty["events"] == [] and empty["head"] == head and empty["session_id"]
    client.ok("prompt", text="say: news")
    assert client.events(head, wait=10)[0]["type"] == "turn.started"


def test_unacked_events_survive_a_restart_with_their_numbers(make_bridge):
    bridge = make_bridge()
    first = bridge.client.run_turn("say: one")
    bridge.client.ok("ack", through=2)
    session_id = bridge.client.ok("status")["session_id"]
    bridge.stop()

    bridge.start()
    after = bridge.client.events(2)
    assert after[: len(first) - 2] == first[2:]
    restart = after[len(first) - 2:]
    assert types(restart) == ["bridge.started"]
    assert restart[0]["bseq"] == first[-1]["bseq"] + 1
    assert restart[0]["data"]["resumed"] is True
    assert restart[0]["data"]["session_start_source"] == "resume"
    assert bridge.client.ok("status")["session_id"] == session_id
