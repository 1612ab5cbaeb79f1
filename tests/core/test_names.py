"""Agent names: what a prefix may be, which agent a store URL and a name select, and which keys could be another's."""

from __future__ import annotations

import pytest

from brainstem.core import keys
from brainstem.core.errors import ConfigError
from brainstem.core.names import agent_prefix, candidate, is_reserved, selected


@pytest.mark.parametrize("value, want", [(None, ""), ("", ""), ("  ", ""), ("bob", "bob:"), ("bob:", "bob:"),
                                         (" bob: ", "bob:"), ("a", "a:"), ("0-x_y", "0-x_y:"),
                                         ("a" * 32, "a" * 32 + ":")])
def test_a_prefix_is_empty_for_the_default_agent_else_name_colon(value, want):
    assert agent_prefix(value) == want


@pytest.mark.parametrize("value", ["Bob", "-x", "_x", "a:b:", "a:b", "a" * 33, "b o b", "bob::", 7])
def test_a_name_of_the_wrong_form_is_one_line_naming_the_source_and_the_value(value):
    with pytest.raises(ConfigError) as e:
        agent_prefix(value, "BRAINSTEM_KV_PREFIX")
    assert str(e.value).startswith(f"BRAINSTEM_KV_PREFIX {value!r} is not a valid agent name")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(keys.DEFAULT_AGENT_SEGMENTS) + ["__agents__"])
def test_the_default_agents_own_segments_are_reserved(name):
    assert is_reserved(name)
    if not name.startswith("_"):
        with pytest.raises(ConfigError, match="is reserved"):
            agent_prefix(name)


def test_the_name_wins_over_the_url_even_empty_and_the_url_over_the_default():
    assert selected("sqlite:///a.db?prefix=alice", "bob") == "bob:"
    assert selected("sqlite:///a.db?prefix=alice", "") == ""
    assert selected("redis://127.0.0.1:6379/0?prefix=alice:", None) == "alice:"
    assert selected("redis://127.0.0.1:6379/0", None) == ""
    with pytest.raises(ConfigError, match=r"BRAINSTEM_KV \?prefix="):
        selected("sqlite:///a.db?prefix=Not-A-Name", None)


@pytest.mark.parametrize("key, want", [("bob:notes", "bob"), ("bob:", "bob"), ("a-b_c:x:y", "a-b_c"),
                                       ("notes", None), (":x", None), ("Bob:x", None), ("soul:x", None),
                                       ("config:defaults", None), ("tooldata:x:y", None),
                                       ("a" * 33 + ":x", None), ("-a:x", None)])
def test_only_a_name_shaped_first_segment_that_is_not_reserved_could_be_another_agents(key, want):
    assert candidate(key) == want
