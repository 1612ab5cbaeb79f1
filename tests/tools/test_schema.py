"""Tool input schemas and tool calls: what an agent step offers the model, and how it reads the answer.

Pure functions (no store, no network): the JSON Schema a tool's meta gives,
the check of the model's arguments against it, and the parsing of tool calls
from whatever a provider, an adapter or a cassette returns. The inputs are
hostile where it matters: the agent writes both the schema and, through the
model, the arguments, and the check runs in the runtime, outside the sandbox.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brainstem.llm.messages import assistant_message, parse_tool_calls, request_chars
from brainstem.tools.schema import SchemaError, check_arguments, function_spec, input_schema
from brainstem.tools.tool import ToolMeta


def meta(input_: dict, **fields) -> ToolMeta:
    return ToolMeta(description="d", input=input_, **fields)


# --- schemas -------------------------------------------------------------------------------------------

def test_a_json_schema_is_offered_as_it_is():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    spec = function_spec("search", meta(schema))
    assert spec == {"type": "function", "function": {"name": "search", "description": "d", "parameters": schema}}


def test_no_input_is_an_empty_object_and_prose_becomes_descriptions():
    assert input_schema(meta({})) == {"type": "object"}
    prose = {"url": "string, required: the URL", "n": {"type": "integer", "description": "how many"}}
    assert input_schema(meta(prose)) == {"type": "object", "properties": {
        "url": {"description": "string, required: the URL"}, "n": {"type": "integer", "description": "how many"}}}
    # prose constrains nothing but the shape: the tool checks its own arguments
    assert check_arguments(input_schema(meta(prose)), '{"anything": 1}') == ({"anything": 1}, None)


@pytest.mark.parametrize("bad, why", [
    ({"type": "object", "properties": {"x": {"type": 7}}}, "not a valid JSON Schema"),
    ({"type": "string"}, "must describe an object"),
    ({"type": "object", "required": "x"}, "not a valid JSON Schema"),
])
def test_a_broken_schema_is_a_clear_error(bad, why):
    with pytest.raises(SchemaError, match=why):
        input_schema(meta(bad))


# --- checking the model's arguments --------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 1}},
          "required": ["text"], "additionalProperties": False}


@pytest.mark.parametrize("arguments, expect", [
    ('{"text": "hi"}', ({"text": "hi"}, None)),
    ('{"text": "hi", "n": 2}', ({"text": "hi", "n": 2}, None)),
    ("", (None, "'text' is a required property")),  # empty arguments are {}: then the schema speaks
    ('{"text": "hi"', (None, "not valid JSON")),
    ("[1]", (None, "must be a JSON object")),
    ('"text"', (None, "must be a JSON object")),
    ('{"text": "far too long a text"}', (None, "at text: 'far too long a text' is too long")),
    ('{"text": "hi", "n": 0}', (None, "at n: 0 is less than the minimum of 1")),
    ('{"text": "hi", "extra": 1}', (None, "Additional properties are not allowed")),
])
def test_arguments_are_checked_against_the_schema(arguments, expect):
    value, error = check_arguments(SCHEMA, arguments)
    assert value == expect[0]
    if expect[1] is None:
        assert error is None
    else:
        assert expect[1] in error and "\n" not in error and len(error) < 400


def test_an_agents_catastrophic_pattern_is_not_evaluated_by_the_runtime():
    # (a+)+$ against "aaaa...!" takes exponential time in Python's re; the check must not run it.
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"},
                                               "pattern": {"type": "string"}},
              "patternProperties": {"^(a+)+$": {"type": "integer"}}}
    evil = json.dumps({"s": "a" * 40 + "!", "pattern": "an argument named pattern is kept", "a" * 40 + "!": "x"})
    t0 = time.monotonic()
    value, error = check_arguments(schema, evil)
    assert time.monotonic() - t0 < 2.0
    assert error is None and value["pattern"] == "an argument named pattern is kept"
    # ...while the rest of the schema still applies, inside a property called "pattern" too
    assert "is not of type 'string'" in check_arguments(schema, '{"pattern": 5}')[1]


def test_deeply_nested_arguments_are_an_error_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    value, error = check_arguments({"type": "object"}, '{"x": ' + deep + "}")
    assert value is None and error


def test_a_schema_that_refers_outside_itself_fetches_nothing():
    schema = {"type": "object", "properties": {"x": {"$ref": "https://example.invalid/schema.json"}}}
    value, error = check_arguments(schema, '{"x": 1}')
    assert value is None and "cannot be checked" in error


# --- tool calls as providers send them -----------------------------------------------------------------

def test_tool_calls_in_the_openai_format_and_flattened():
    raw = [{"id": "a", "type": "function", "function": {"name": "kv_read", "arguments": '{"key": "w"}'}},
           {"name": "shout", "arguments": {"text": "x"}},       # an adapter that parsed them
           {"id": "", "function": {"name": "noargs"}},           # no id, no arguments
           "not a call", {"function": {"arguments": "{}"}},      # dropped: no name
           {"id": 5, "name": "n", "arguments": ["not", "json", "text"]}]
    assert parse_tool_calls(raw) == [
        {"id": "a", "name": "kv_read", "arguments": '{"key": "w"}'},
        {"id": "call_1", "name": "shout", "arguments": '{"text": "x"}'},
        {"id": "call_2", "name": "noargs", "arguments": "{}"},
        {"id": "call_5", "name": "n", "arguments": '["not", "json", "text"]'},
    ]
    assert parse_tool_calls(None) == parse_tool_calls({"name": "x"}) == []


def test_a_runaway_answer_is_capped():
    calls = parse_tool_calls([{"name": "t", "arguments": "x" * 1_000_000}] * 100)
    assert len(calls) == 16 and all(len(c["arguments"]) == 100_000 for c in calls)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                       max_size=4), max_leaves=30))
def test_any_json_parses_to_calls_or_nothing_never_raises(raw):
    for call in parse_tool_calls(raw if isinstance(raw, list) else [raw]):
        assert set(call) == {"id", "name", "arguments"} and all(isinstance(v, str) for v in call.values())
        assert call["name"]


def test_a_request_is_priced_with_its_calls_and_its_tools():
    calls = [{"id": "c", "name": "kv_read", "arguments": '{"key": "wisdom"}'}]
    tools = [function_spec("kv_read", meta({"type": "object", "properties": {"key": {"type": "string"}}}))]
    messages = [{"role": "user", "content": "hi"}, assistant_message("", calls),
                {"role": "tool", "tool_call_id": "c", "content": "result"}]
    bare = request_chars({"messages": messages})
    assert bare == len("hi") + len("kv_read") + len('{"key": "wisdom"}') + len("result")
    assert request_chars({"messages": messages, "tools": tools}) == bare + len(json.dumps(tools))
