"""sandboxes/bridge/protocol.py: every message round-trips, the wire shapes stay
the ones bridges of the previous release speak, and answers that break a type
or a bound are refused with the field named."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from sandboxes.bridge import protocol as p

from .harness import SANDBOXES

TS = "2026-01-02T03:04:05.123456+00:00"


def event(bseq: int, type_: str = "turn.started", **data) -> dict:
    return {"bseq": bseq, "type": type_, "ts": TS, "data": data or {"turn": 1}}


#: What runner.status() answered before protocol.py existed (no "protocol").
OLD_STATUS = {"state": "running", "paused": False,
              "turn": {"turn": 2, "command_id": "41", "step": 3}, "queued": [3, 4],
              "head": 12, "acked": 9, "session_id": "9f86d081884c7d65", "model": "demo",
              "turns": 4, "pending_requests": ["req-demo-2-3-1"]}

STATUS = p.Status(state=p.BridgeState.RUNNING, paused=True, turn=p.TurnInfo(2, None, 3),
                  queued=(3,), head=12, acked=9, session_id="s1", model="openai:gpt",
                  turns=3, pending_requests=("req-1",), protocol=p.PROTOCOL_VERSION)

ANSWERS = [
    STATUS,
    p.Status(state=p.BridgeState.IDLE, turn=None, queued=(), head=0, acked=0, session_id="s",
             model="demo", turns=0, pending_requests=()),
    p.EventsPage((p.BridgeEvent(**event(5)), p.BridgeEvent(**event(6, "tool.result", x=[1]))),
                 head=7, session_id="s1"),
    p.EventsPage((), head=0, session_id="s1"),
    p.PromptAnswer(3, queued=True, position=1), p.PromptAnswer(3, duplicate=True),
    p.SteerAnswer(2), p.SteerAnswer(2, duplicate=True),
    p.AbortAnswer(False), p.AbortAnswer(True, 4),
    p.AckAnswer(12), p.ReplyAnswer("req-1"), p.PauseAnswer(True), p.PauseAnswer(False),
    p.SeedAnswer(5, 2), p.ShutdownAnswer(True),
    p.ErrorInfo("cursor_ahead", "past the head", {"head": 3, "session_id": "s1"}),
]

REQUESTS = [
    p.PromptRequest("hello", "42"), p.PromptRequest("hello"), p.SteerRequest("faster", "43"),
    p.EventsRequest(5, 20.0, 200), p.EventsRequest(), p.AckRequest(9),
    p.ReplyRequest("req-1", {"agent_id": "a"}), p.ReplyRequest("req-1", None),
    p.ReplyRequest("req-1", error={"code": "limit", "message": "full"}),
    p.SeedRequest([{"role": "user", "text": "hi"}], 1), p.SeedRequest([]),
]


@pytest.mark.parametrize("message", ANSWERS + REQUESTS, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_a_json_line(message):
    line = p.encode_line(message.to_wire())
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert type(message).from_wire(p.decode_line(line)) == message


def test_every_op_has_a_typed_answer_and_a_handler_name():
    assert set(p.ANSWERS) == set(p.Op)
    assert {type(m) for m in ANSWERS} >= set(p.ANSWERS.values())
    assert p.parse_op("status") is p.Op.STATUS
    assert p.parse_op("nope") is None and p.parse_op(["status"]) is None


def test_wire_shapes_are_the_previous_releases_plus_protocol():
    assert STATUS.to_wire() == {"state": "running", "paused": True,
                                "turn": {"turn": 2, "command_id": None, "step": 3},
                                "queued": [3], "head": 12, "acked": 9, "session_id": "s1",
                                "model": "openai:gpt", "turns": 3,
                                "pending_requests": ["req-1"], "protocol": 1}
    assert p.PromptAnswer(3, True, 1).to_wire() == {"turn": 3, "queued": True, "position": 1}
    assert p.PromptAnswer(3, duplicate=True).to_wire() == {"turn": 3, "duplicate": True}
    assert p.SteerAnswer(2).to_wire() == {"turn": 2}
    assert p.AbortAnswer(False).to_wire() == {"aborted": False}
    assert p.AbortAnswer(True, 4).to_wire() == {"aborted": True, "turn": 4}
    assert p.PromptRequest("hi").to_wire() == {"text": "hi"}
    assert p.ReplyRequest("r", None).to_wire() == {"request_id": "r", "result": None}
    assert p.ok_answer(7, p.AckAnswer(3)) == {"id": 7, "ok": True, "acked": 3}
    assert p.error_answer(7, p.ErrorInfo("bad_ack", "no", {"head": 1})) == {
        "id": 7, "ok": False, "error": {"code": "bad_ack", "message": "no", "head": 1}}


def test_an_old_bridges_status_is_protocol_version_1():
    status = p.Status.from_wire(OLD_STATUS)
    assert status.protocol == 1 and status.state is p.BridgeState.RUNNING
    assert status.turn == p.TurnInfo(2, "41", 3) and status.queued == (3, 4)
    older = {k: v for k, v in OLD_STATUS.items() if k != "paused"}  # from before pause
    assert p.Status.from_wire(older).paused is False


def test_fields_a_newer_bridge_adds_are_ignored():
    status = p.Status.from_wire({**OLD_STATUS, "protocol": 2, "budget": {"tokens": 5}})
    assert status.protocol == 2
    page = p.EventsPage.from_wire({"events": [{**event(1), "origin": "x"}], "head": 1,
                                   "session_id": "s", "more": True})
    assert page.events[0] == p.BridgeEvent(**event(1))


def changed(wire: dict, dotted: str, value) -> dict:
    """A deep copy of ``wire`` with the field at ``dotted`` set (or removed: ...)."""
    out = copy.deepcopy(wire)
    *parents, last = dotted.split(".")
    target = out
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = int(last) if isinstance(target, list) else last
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return out


@pytest.mark.parametrize("dotted, value, field", [
    ("state", "busy", "state"),
    ("state", ["idle"], "state"),
    ("turn", None, "turn"),                      # running without a turn
    ("turn.step", "3", "turn.step"),
    ("turn.turn", 0, "turn.turn"),
    ("turn.command_id", 41, "turn.command_id"),
    ("head", "12", "head"),
    ("head", True, "head"),
    ("head", -1, "head"),
    ("head", 2**63, "head"),
    ("head", 12.0, "head"),
    ("head", ..., "head"),
    ("acked", 13, "acked"),                      # past the head
    ("queued", [0], "queued[0]"),
    ("queued", {"3": 1}, "queued"),
    ("queued", list(range(1, p.MAX_ITEMS + 2)), "queued"),
    ("session_id", "x" * (p.MAX_ID + 1), "session_id"),
    ("session_id", None, "session_id"),
    ("model", 7, "model"),
    ("turns", None, "turns"),
    ("pending_requests", ["ok", 5], "pending_requests[1]"),
    ("paused", "no", "paused"),
    ("protocol", 0, "protocol"),
])
def test_a_malformed_status_is_refused_naming_the_field(dotted, value, field):
    with pytest.raises(p.ProtocolError) as err:
        p.Status.from_wire(changed(OLD_STATUS, dotted, value))
    assert err.value.field == field and str(err.value).startswith(field)


PAGE = {"events": [event(5), event(6, "message.delta", turn=1, text="hi")], "head": 6,
        "session_id": "s1"}
DEEP: dict = {}
_leaf = DEEP
for _ in range(p.MAX_DEPTH + 1):
    _leaf["a"] = {"b": 1}
    _leaf = _leaf["a"]


@pytest.mark.parametrize("dotted, value, field", [
    ("events", {"0": event(5)}, "events"),
    ("events", [event(i + 1) for i in range(p.MAX_EVENTS + 1)], "events"),
    ("events.0", "turn.started", "events[0]"),
    ("events.0.bseq", 0, "events[0].bseq"),
    ("events.0.bseq", "5", "events[0].bseq"),
    ("events.1.bseq", 5, "events[1].bseq"),      # a repeat
    ("events.1.bseq", 4, "events[1].bseq"),      # a step back
    ("head", 5, "head"),                          # below the last event
    ("session_id", 5, "session_id"),
])
def test_a_malformed_events_page_is_refused_naming_the_field(dotted, value, field):
    with pytest.raises(p.ProtocolError) as err:
        p.EventsPage.from_wire(changed(PAGE, dotted, value))
    assert err.value.field == field


@pytest.mark.parametrize("dotted, value, field", [
    ("events.0.type", "Turn.Started", "events[0].type"),
    ("events.0.type", "turn", "events[0].type"),
    ("events.0.type", "turn.started; drop", "events[0].type"),
    ("events.0.type", "a." + "b" * 63, "events[0].type"),
    ("events.0.type", None, "events[0].type"),
    ("events.0.ts", "yesterday", "events[0].ts"),
    ("events.0.ts", "2026-01-02T03:04:05", "events[0].ts"),  # no time zone
    ("events.0.ts", 1767322000, "events[0].ts"),
    ("events.0.data", [1], "events[0].data"),
    ("events.0.data", DEEP, "events[0].data"),
    ("events.0.data", ..., "events[0].data"),
])
def test_an_event_that_breaks_a_rule_is_refused_in_its_place(dotted, value, field):
    """Its bseq still counts, so the cursor moves past it; what it carried is
    not taken — only which field broke which rule."""
    page = p.EventsPage.from_wire(changed(PAGE, dotted, value))
    refused, kept = page.events
    assert refused.bseq == 5 and refused.type == p.REFUSED_EVENT
    assert refused.data["field"] == field and refused.data["reason"]
    assert set(refused.data) == {"field", "reason"}
    assert kept == p.BridgeEvent.from_wire(PAGE["events"][1])


def test_a_gap_in_a_page_is_let_through_for_the_relay_to_journal():
    """A session file edited inside the sandbox can skip numbers: not a broken
    page (the link would break on it forever) but a loss the relay journals
    as `bridge.events_lost` (tests/unit/test_relay.py)."""
    page = p.EventsPage.from_wire(changed(changed(PAGE, "events.1.bseq", 8), "head", 8))
    assert [e.bseq for e in page.events] == [5, 8]
    page.check_answers(p.EventsRequest(after=2, limit=2))  # starts above the cursor: a gap too


def test_a_page_must_answer_its_request():
    page = p.EventsPage.from_wire(PAGE)
    page.check_answers(p.EventsRequest(after=4, limit=2))
    for ask, field in [(p.EventsRequest(after=5), "events[0].bseq"),
                       (p.EventsRequest(after=4, limit=1), "events"),
                       (p.EventsRequest(after=9), "head")]:
        with pytest.raises(p.ProtocolError) as err:
            page.check_answers(ask)
        assert err.value.field == field


@pytest.mark.parametrize("message_type, wire, field", [
    (p.PromptAnswer, {"turn": 3}, "queued"),
    (p.PromptAnswer, {"turn": 0, "queued": False, "position": 0}, "turn"),
    (p.PromptAnswer, {"turn": 3, "queued": 1, "position": 0}, "queued"),
    (p.SteerAnswer, {"turn": "2"}, "turn"),
    (p.SteerAnswer, {"turn": 2, "duplicate": "yes"}, "duplicate"),
    (p.AbortAnswer, {"aborted": True}, "turn"),
    (p.AbortAnswer, {}, "aborted"),
    (p.AckAnswer, {"acked": -1}, "acked"),
    (p.ReplyAnswer, {"request_id": ["r"]}, "request_id"),
    (p.PauseAnswer, {"paused": 1}, "paused"),
    (p.SeedAnswer, {"messages": 1}, "turns"),
    (p.ShutdownAnswer, {"stopping": None}, "stopping"),
    (p.ShutdownAnswer, ["stopping"], "answer"),
    (p.ErrorInfo, {"code": "Bad Code", "message": "m"}, "error.code"),
    (p.ErrorInfo, {"code": "no_turn"}, "error.message"),
    (p.ErrorInfo, {"code": "no_turn", "message": "m" * (p.MAX_MESSAGE + 1)}, "error.message"),
    (p.ErrorInfo, {"code": "cursor_ahead", "message": "m", "head": "3"}, "error.head"),
    (p.ErrorInfo, {"code": "x", "message": "m", "session_id": 3}, "error.session_id"),
    (p.ErrorInfo, {"code": "x", "message": "m", "more": {"a": 1}}, "error.more"),
    (p.ErrorInfo, {"code": "x", "message": "m", **{f"k{i}": i for i in range(17)}}, "error"),
    (p.ErrorInfo, "boom", "error"),
])
def test_malformed_answers_are_refused_naming_the_field(message_type, wire, field):
    with pytest.raises(p.ProtocolError) as err:
        message_type.from_wire(wire)
    assert err.value.field == field


def test_the_envelope_is_checked():
    assert p.parse_answer({"id": 3, "ok": True, "acked": 1}, 3) == {"acked": 1}
    assert p.parse_answer({"id": 3, "ok": False, "error": {"code": "bad_ack", "message": "m"}},
                          3) == p.ErrorInfo("bad_ack", "m")
    for wire, field in [({"id": 4, "ok": True}, "id"), ({"id": True, "ok": True}, "id"),
                        ({"ok": True}, "id"), ({"id": 3}, "ok"), ({"id": 3, "ok": "yes"}, "ok"),
                        ({"id": 3, "ok": False}, "error"),
                        ({"id": 3, "ok": False, "error": "boom"}, "error"), ([3], "answer")]:
        with pytest.raises(p.ProtocolError) as err:
            p.parse_answer(wire, 1 if wire == {"id": True, "ok": True} else 3)
        assert err.value.field == field


@pytest.mark.parametrize("line", [b"not json", b"NaN", b'{"head": Infinity}', b"\xff\xfe{",
                                  b"[" * 100_000 + b"]" * 100_000, b""])
def test_only_standard_json_lines_decode(line):
    with pytest.raises(p.ProtocolError) as err:
        p.decode_line(line)
    assert err.value.field == "line"


def test_requests_parse_with_the_bridges_defaults_and_clamping():
    assert p.EventsRequest.from_wire({"op": "events"}) == p.EventsRequest(0, 0.0, p.MAX_EVENTS)
    assert p.EventsRequest.from_wire({"after": 3, "wait": 99, "limit": 0}) == \
        p.EventsRequest(3, p.MAX_WAIT, 1)
    assert p.EventsRequest.from_wire({"wait": -5, "limit": 10_000}) == p.EventsRequest(0, 0.0, 500)
    assert p.EventsRequest.from_wire({"wait": None}).wait == 0.0
    assert p.EventsRequest.from_wire({"wait": "2.5"}).wait == 2.5  # float() as always
    assert p.SeedRequest.from_wire({"messages": [], "turns": "3"}).turns == 3  # int() as always
    assert p.SeedRequest.from_wire({"messages": [], "turns": 0}).turns is None  # 0: count
    assert p.AckRequest.from_wire({}) == p.AckRequest(0)
    assert p.PromptRequest.from_wire({"text": "hi", "command_id": None}) == p.PromptRequest("hi")
    assert p.ReplyRequest.from_wire({"request_id": "r", "error": None}) == p.ReplyRequest("r")


@pytest.mark.parametrize("request_type, wire, message", [
    (p.PromptRequest, {"text": "  "}, "text must be a non-empty string"),
    (p.PromptRequest, {}, "text must be a non-empty string"),
    (p.SteerRequest, {"text": "x", "command_id": 5}, "command_id must be a string"),
    (p.EventsRequest, {"after": -1}, "after must be a non-negative integer"),
    (p.EventsRequest, {"after": None}, "after must be a non-negative integer"),
    (p.EventsRequest, {"limit": "5"}, "limit must be a non-negative integer"),
    (p.EventsRequest, {"wait": "soon"}, "wait must be a number of seconds"),
    (p.EventsRequest, {"wait": "nan"}, "wait must be a number of seconds"),
    (p.EventsRequest, {"wait": [1]}, "wait must be a number of seconds"),
    (p.AckRequest, {"through": 1.5}, "through must be a non-negative integer"),
    (p.ReplyRequest, {"result": 1}, "request_id must be a string"),
    (p.ReplyRequest, {"request_id": "r"}, "reply needs a result or an error"),
    (p.SeedRequest, {"messages": {}}, "messages must be a list"),
    (p.SeedRequest, {"messages": [], "turns": "three"}, "turns must be a non-negative integer"),
    (p.SeedRequest, {"messages": [], "turns": -2}, "turns must be a non-negative integer"),
])
def test_bad_requests_are_refused_with_the_bridges_messages(request_type, wire, message):
    with pytest.raises(p.ProtocolError) as err:
        request_type.from_wire(wire)
    assert str(err.value) == message


def test_the_protocol_imports_only_the_standard_library_and_itself():
    """The host imports protocol.py: it must not pull in the runner, and the
    sandbox runs it with no site-packages (-S, -I)."""
    code = ("import sys, json; import bridge.protocol; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'bridge')))")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(SANDBOXES)!r}); {code}"], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == ["bridge", "bridge.protocol", "bridge.wire"]
