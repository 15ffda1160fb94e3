"""The checker catches what it claims to (no server: synthetic transcripts)."""

from tests.faults import invariants


def _ev(seq, etype, **data):
    return {"seq": seq, "type": etype, "data": data}


GOOD = [
    _ev(1, "agent.spawned", command=1),
    _ev(2, "command.prompt", command=2, text="x"),
    _ev(3, "bridge.started", bseq=1),
    _ev(4, "turn.started", turn=1, command_id="2", bseq=2),
    _ev(5, "tool.dispatched", turn=1, tool_call_id="c1", name="write",
        input={"path": "a.txt", "content": "A"}, bseq=3),
    _ev(6, "tool.result", turn=1, tool_call_id="c1", name="write", exit_code=0, is_error=False,
        bseq=4),
    _ev(7, "turn.finished", turn=1, text="ok", bseq=5),
]


def _renumber(events):
    return [dict(e, seq=i) for i, e in enumerate(events, 1)]


def test_a_sound_transcript_has_no_violation():
    assert invariants.transcript(None, "ag", GOOD) == []
    assert invariants.expected_files(GOOD) == {"a.txt": "A"}


def test_each_broken_invariant_is_reported():
    gap = GOOD[:3] + [dict(e, seq=e["seq"] + 1) for e in GOOD[3:]]
    assert any("not contiguous" in v for v in invariants.transcript(None, "ag", gap))
    twice = _renumber(GOOD + [dict(GOOD[6])])
    found = invariants.transcript(None, "ag", twice)
    assert any("bseq 5 journaled twice" in v for v in found)
    assert any("turn 1 settled 2 times" in v for v in found)
    hole = _renumber(GOOD[:4] + [_ev(0, "turn.interrupted", turn=1, text="", bseq=9)])
    assert any("with a gap" in v for v in invariants.transcript(None, "ag", hole))
    cmd = _renumber(GOOD + [_ev(0, "command.prompt", command=2, text="x")])
    assert any("command.prompt for command 2 journaled 2 times" in v
               for v in invariants.transcript(None, "ag", cmd))
    unsettled = _renumber(GOOD + [_ev(0, "turn.started", turn=2, command_id="3", bseq=6)])
    assert any("turn 2 settled 0 times" in v for v in invariants.transcript(None, "ag", unsettled))
    assert invariants.unsettled_turns(unsettled) == [2]


def test_a_fresh_sandbox_starts_a_new_bridge_incarnation_and_resets_files():
    rebuilt = _renumber(GOOD + [_ev(0, "agent.restored", rung="rebuild"),
                                _ev(0, "bridge.started", bseq=1)])
    assert invariants.transcript(None, "ag", rebuilt) == []
    assert invariants.expected_files(rebuilt) == {}
    restored = _renumber(GOOD + [_ev(0, "agent.checkpointed", checkpoint=7, turn=1),
                                 _ev(0, "agent.restored", rung="restore", checkpoint=7,
                                     checkpoint_turn=1),
                                 _ev(0, "bridge.started", bseq=5)])
    assert invariants.transcript(None, "ag", restored) == []
    assert invariants.expected_files(restored) == {"a.txt": "A"}


def test_bseq_counts_restart_only_where_the_transcript_says_so():
    """tests/bseqs.py: a count starts again at session_changed (at 1), at
    cursor_reset (at `to` + 1) and at a fresh sandbox; a gap anywhere else, a
    repeat, or a `bridge.events_lost` is trouble."""
    from tests.bseqs import bseq_trouble

    reset = _renumber(GOOD + [_ev(0, "bridge.cursor_reset", to=3), _ev(0, "bridge.started", bseq=4)])
    assert bseq_trouble(reset) == []
    changed = _renumber(GOOD + [_ev(0, "bridge.session_changed", to="s2"),
                                _ev(0, "bridge.started", bseq=1)])
    assert bseq_trouble(changed) == []
    wrong_start = _renumber(GOOD + [_ev(0, "bridge.session_changed", to="s2"),
                                    _ev(0, "bridge.started", bseq=2)])
    assert "with a gap" in " ".join(bseq_trouble(wrong_start))
    lost = _renumber(GOOD + [_ev(0, "bridge.events_lost", after=5, through=7),
                             _ev(0, "bridge.started", bseq=8)])
    assert len(bseq_trouble(lost)) == 1 and "lost" in bseq_trouble(lost)[0]
    assert bseq_trouble(lost, lost_ok=True) == []
    skipped = _renumber(GOOD + [_ev(0, "bridge.started", bseq=7)])
    assert "bseq 7 journaled with a gap" in " ".join(bseq_trouble(skipped))


def _two_checkpoints(*restored):
    """Turn 1 writes a.txt=A (checkpoint 7), turn 2 writes a.txt=B (checkpoint 8)."""
    turn2 = [_ev(0, "command.prompt", command=3, text="y"),
             _ev(0, "turn.started", turn=2, command_id="3", bseq=6),
             _ev(0, "tool.dispatched", turn=2, tool_call_id="c2", name="write",
                 input={"path": "a.txt", "content": "B"}, bseq=7),
             _ev(0, "tool.result", turn=2, tool_call_id="c2", name="write", exit_code=0,
                 is_error=False, bseq=8),
             _ev(0, "turn.finished", turn=2, text="ok", bseq=9),
             _ev(0, "agent.checkpointed", checkpoint=8, turn=2)]
    return _renumber(GOOD + [_ev(0, "agent.checkpointed", checkpoint=7, turn=1)] + turn2
                     + list(restored))


def test_the_files_expected_come_from_the_newest_checkpoint_taken_not_the_one_restored():
    """The product restoring a stale checkpoint (or rebuilding although one was
    live) must not shrink what the checker expects (issue 16, hole 3)."""
    good = _two_checkpoints(_ev(0, "agent.restored", rung="restore", checkpoint=8,
                                checkpoint_turn=2))
    assert invariants.restores("ag", good) == []
    assert invariants.expected_files(good) == {"a.txt": "B"}
    stale = _two_checkpoints(_ev(0, "agent.restored", rung="restore", checkpoint=7,
                                 checkpoint_turn=1))
    assert invariants.expected_files(stale) == {"a.txt": "B"}
    assert "the newest taken was 8" in " ".join(invariants.restores("ag", stale))
    rebuilt = _two_checkpoints(_ev(0, "agent.restored", rung="rebuild"))
    assert invariants.expected_files(rebuilt) == {"a.txt": "B"}
    assert "rebuild" in " ".join(invariants.restores("ag", rebuilt))
    expired = _two_checkpoints(_ev(0, "agent.checkpoint_expired", checkpoint=8, turn=2),
                               _ev(0, "agent.restored", rung="restore", checkpoint=7,
                                   checkpoint_turn=1))
    assert invariants.restores("ag", expired) == []
    assert invariants.expected_files(expired) == {"a.txt": "A"}
    none = _renumber(GOOD + [_ev(0, "agent.restored", rung="restore", checkpoint=3)])
    assert "no checkpoint was taken" in " ".join(invariants.restores("ag", none))
