"""sessions/inputs.py: what both doors accept from a client (cursors, JSON)."""

from __future__ import annotations

import pytest

from sessions import inputs


@pytest.mark.parametrize("text, value", [("0", 0), ("42", 42), ("9" * 18, int("9" * 18))])
def test_a_cursor_is_ascii_digits(text, value):
    assert inputs.cursor(text) == value


@pytest.mark.parametrize("text", ["²", "٣", "１", "𝟙", "५", "1²", "-1", "+1", " 1", "1 ", "1.0",
                                  "", "9" * 19, "9" * 5000, "0x1", None, 3])
def test_anything_else_is_no_cursor(text):
    assert inputs.cursor(text) is None


def test_json_within_the_limits_is_read():
    assert inputs.loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    assert inputs.loads("[" * 64 + "]" * 64) is not None
    assert inputs.loads("9" * inputs.MAX_INT_DIGITS) == int("9" * inputs.MAX_INT_DIGITS)


@pytest.mark.parametrize("text, code, says", [
    ("[" * 65 + "]" * 65, "too_deep", "deeper than 64"),
    ("[" * 100_000 + "]" * 100_000, "too_deep", "deeper than 64"),
    ('{"a": ' * 3000 + "1" + "}" * 3000, "too_deep", "deeper than 64"),
    ("9" * 5000, "out_of_range", "more than 4300 digits"),
    ("-" + "9" * 5000, "out_of_range", "more than 4300 digits"),
    ("1e999", "out_of_range", "out of range"),
    ("NaN", "malformed_json", "NaN"),
    ("-Infinity", "malformed_json", "Infinity"),
    ('{"a": 1,}', "malformed_json", "line 1, column 9"),
    ("[" * 5000, "too_deep", "deeper than 64"),
])
def test_json_past_the_limits_is_an_input_error(text, code, says):
    with pytest.raises(inputs.InputError) as caught:
        inputs.loads(text)
    assert caught.value.code == code and says in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_depth_counts_without_recursion():
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert inputs.depth(deep) == 50_001
    assert inputs.depth(deep, stop_after=10) == 11
    assert inputs.depth(1) == 0 and inputs.depth({"a": [{}]}) == 3
