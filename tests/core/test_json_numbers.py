"""Numbers read out of JSON nobody vouches for: only finite numbers pass, never a bool, an infinity or a string."""

from __future__ import annotations

import json

import pytest

from brainstem.core.json_numbers import count, finite, finite_or


@pytest.mark.parametrize("value, want", [(0, 0.0), (3, 3.0), (-2, -2.0), (2.5, 2.5), (1e308, 1e308)])
def test_a_finite_number_is_itself_as_a_float(value, want):
    assert finite(value) == want and isinstance(finite(value), float)


@pytest.mark.parametrize("value", [True, False, None, "1", "1.5", [1], {"n": 1}, float("inf"), float("-inf"),
                                   float("nan"), 10 ** 400, -(10 ** 400)])
def test_what_is_not_a_finite_number_is_none(value):
    assert finite(value) is None


@pytest.mark.parametrize("text", ["1e999", "-1e999", "1" + "0" * 400])
def test_what_json_parses_past_a_floats_range_is_none(text):
    assert finite(json.loads(text)) is None


def test_finite_or_falls_back_to_the_default_as_a_float():
    assert finite_or(0.25, 9) == 0.25
    assert finite_or(True, 9) == 9.0 and isinstance(finite_or(True, 9), float)
    assert finite_or(json.loads("1e999"), 0) == 0.0


@pytest.mark.parametrize("value, want", [(0, 0), (12, 12), (12.9, 12), (-1, None), (-0.5, None), (True, None),
                                         ("12", None), (float("inf"), None), (None, None)])
def test_a_count_is_a_whole_number_at_least_zero(value, want):
    assert count(value) == want
