"""The tier-3 OpenRouter client against a real HTTP server on loopback (no mocks)."""

from __future__ import annotations

import time

import pytest

from brainstem.llm.openrouter import LLMResponse, ProviderError, chat
from tests.helpers import free_port as closed_port

KEY = "sk-or-v1-SECRETSECRETSECRET0123456789abcdef"
FAST = {"backoff_base": 0.01, "backoff_max": 0.05}


def req(model: str = "test/model", **extra) -> dict:
    r = {"model": model, "messages": [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "say hello"}], "max_tokens": 100}
    r.update(extra)
    return r


# ------------------------------------------------------------------ happy paths


def test_plain_answer_and_request_sent_as_is(llm):
    llm.queue("hello there")
    r = chat(req(reasoning={"effort": "low"}, temperature=0.2), base_url=llm.base_url + "/", api_key=KEY, **FAST)
    assert isinstance(r, LLMResponse)
    assert r.content == "hello there"
    assert r.finish_reason == "stop" and r.truncated is False
    assert r.model == "test/model"
    assert r.raw["choices"][0]["message"]["content"] == "hello there"
    assert r.attempts == 1
    assert llm.requests == [req(reasoning={"effort": "low"}, temperature=0.2)]
    h = {k.lower(): v for k, v in llm.request_headers[0].items()}
    assert h["authorization"] == f"Bearer {KEY}"
    assert h["x-title"] == "Brainstem"
    assert h["user-agent"].startswith("brainstem/") and "http-referer" not in h
    assert h["content-type"] == "application/json"


def test_no_key_sends_no_authorization(llm):
    llm.queue("ok")
    chat(req(), base_url=llm.base_url, api_key=None, **FAST)
    assert "authorization" not in {k.lower() for k in llm.request_headers[0]}


def test_content_parts_concatenated_and_null_content(llm):
    llm.queue(
        {"content": [{"type": "text", "text": "Hello, "}, {"type": "image_url", "image_url": {"url": "x"}},
                     {"type": "text", "text": "world"}]},
        {"content": None},
    )
    assert chat(req(), base_url=llm.base_url, api_key=KEY, **FAST).content == "Hello, world"
    assert chat(req(), base_url=llm.base_url, api_key=KEY, **FAST).content == ""


def test_usage_cost_and_model_parsing(llm):
    llm.queue({"content": "x", "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150,
                                         "cost": 0.00042}, "model": "anthropic/claude-x-20250101"})
    r = chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.usage == {"prompt_tokens": 120, "completion_tokens": 30, "reasoning_tokens": 0, "cached_tokens": 0,
                       "cache_write_tokens": 0, "cost": 0.00042}
    assert r.model == "anthropic/claude-x-20250101"


def test_default_usage_without_cost_gives_none(llm):
    llm.queue("abcdefgh")
    r = chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.usage["cost"] is None
    assert r.usage["completion_tokens"] == 3 and r.usage["prompt_tokens"] > 0


def test_reasoning_tokens(llm):
    llm.queue({"content": "42", "reasoning_tokens": 77, "cost": 0.01})
    r = chat(req(reasoning={"effort": "high"}), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.usage["reasoning_tokens"] == 77 and r.usage["cost"] == 0.01


def test_finish_reason_length_is_truncated(llm):
    llm.queue({"content": "", "finish_reason": "length", "reasoning_tokens": 100})
    r = chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.truncated is True and r.finish_reason == "length" and r.content == ""


# ------------------------------------------------------------------ retries


def test_429_retry_after_honoured_then_success(llm):
    llm.queue({"status": 429, "headers": {"Retry-After": "1"}, "message": "slow down"}, "finally")
    t0 = time.monotonic()
    r = chat(req(), base_url=llm.base_url, api_key=KEY, backoff_base=0.01, backoff_max=5)
    waited = time.monotonic() - t0
    assert r.content == "finally" and r.attempts == 2
    assert len(llm.requests) == 2
    assert 0.9 <= waited < 1.8  # the server's 1 s, not the 0.01 s exponential backoff


def test_429_retry_after_http_date(llm):
    from email.utils import formatdate

    llm.queue({"status": 429, "headers": {"Retry-After": formatdate(time.time() + 30, usegmt=True)}}, "ok")
    t0 = time.monotonic()
    r = chat(req(), base_url=llm.base_url, api_key=KEY, backoff_base=0.01, backoff_max=0.3)
    assert r.content == "ok"
    assert 0.25 <= time.monotonic() - t0 < 1.5  # 30 s date capped at 0.3


def test_503_twice_then_success(llm):
    llm.queue({"status": 503}, {"status": 503}, "third time lucky")
    r = chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.content == "third time lucky" and r.attempts == 3
    assert len(llm.requests) == 3


def test_400_not_retried(llm):
    llm.queue({"status": 400, "message": "bad model id"}, "never reached")
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    e = ei.value
    assert e.status == 400 and e.retryable is False and e.attempts == 1
    assert str(e) == "openrouter: HTTP 400: bad model id"
    assert len(llm.requests) == 1


def test_401_message_truncated_and_one_line(llm):
    llm.queue({"status": 401, "message": "no auth\n" + "x" * 1000})
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    msg = str(ei.value)
    assert msg.startswith("openrouter: HTTP 401: no auth x")
    assert "\n" not in msg and len(msg) < 360


def test_attempts_bounded(llm):
    llm.responder = lambda r: {"status": 500, "message": "boom"}
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, max_attempts=3, **FAST)
    assert len(llm.requests) == 3
    e = ei.value
    assert e.status == 500 and e.retryable is True and e.attempts == 3
    assert "HTTP 500: boom" in str(e) and "3 attempts" in str(e)


def test_script_ran_out_is_500(llm):
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, max_attempts=1)
    assert "script ran out" in str(ei.value)


def test_read_timeout_retried_then_error(llm):
    llm.responder = lambda r: {"content": "too late", "delay": 0.6}
    t0 = time.monotonic()
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, timeout=0.15, max_attempts=2, **FAST)
    assert time.monotonic() - t0 < 1.0
    assert len(llm.requests) == 2
    assert ei.value.retryable is True and ei.value.status is None
    assert "ReadTimeout" in str(ei.value)


def test_read_timeout_then_success(llm):
    llm.queue({"content": "slow", "delay": 0.5}, "fast")
    r = chat(req(), base_url=llm.base_url, api_key=KEY, timeout=0.15, **FAST)
    assert r.content == "fast" and r.attempts == 2


def test_connect_error_retried_and_bounded():
    url = f"http://127.0.0.1:{closed_port()}/api/v1"
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=url, api_key=KEY, max_attempts=2, **FAST)
    assert ei.value.attempts == 2 and ei.value.retryable is True
    assert "ConnectError" in str(ei.value)


# ------------------------------------------------------------------ malformed answers


def test_body_not_json(llm):
    llm.queue({"body": "<html>gateway</html>"})
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert str(ei.value) == "openrouter: response was not JSON"
    assert len(llm.requests) == 1


def test_body_without_choices(llm):
    llm.queue({"body": {"id": "gen-1", "choices": []}}, {"body": {"id": "gen-2"}})
    for _ in range(2):
        with pytest.raises(ProviderError) as ei:
            chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
        assert str(ei.value) == "openrouter: response had no choices"
    assert len(llm.requests) == 2


def test_error_object_in_200_body_retryable(llm):
    llm.queue({"body": {"error": {"message": "upstream overloaded", "code": 502}}}, "recovered")
    r = chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert r.content == "recovered" and len(llm.requests) == 2


def test_error_object_in_200_body_not_retryable(llm):
    llm.queue({"body": {"error": {"message": "context too long", "code": 400}}}, "never")
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert ei.value.status == 400 and not ei.value.retryable
    assert "context too long" in str(ei.value)
    assert len(llm.requests) == 1


def test_non_json_error_page(llm):
    llm.queue({"status": 502, "body": "<html>\n<h1>Bad Gateway</h1></html>"}, "ok")
    assert chat(req(), base_url=llm.base_url, api_key=KEY, **FAST).content == "ok"


def test_api_key_never_in_error_messages(llm):
    # the server echoes the key back in every error it can think of
    llm.queue(
        {"status": 401, "message": f"invalid key {KEY}"},
        {"body": {"error": {"message": f"Bearer {KEY} rejected", "code": 403}}},
        {"status": 400, "message": f"key prefix {KEY[:20]}"},
    )
    msgs = []
    for _ in range(3):
        with pytest.raises(ProviderError) as ei:
            chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
        msgs.append(str(ei.value))
        msgs.append(repr(ei.value))
    llm.responder = lambda r: {"status": 503, "message": KEY}
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, max_attempts=2, **FAST)
    msgs += [str(ei.value), repr(ei.value)]
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key=KEY, max_attempts=1)
    msgs += [str(ei.value), repr(ei.value)]
    for m in msgs:
        assert KEY not in m and KEY[:16] not in m and "Authorization" not in m, m
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


def test_unserialisable_request_is_provider_error(llm):
    with pytest.raises(ProviderError):
        chat({"model": "m", "messages": [object()]}, base_url=llm.base_url, api_key=KEY)
    assert llm.requests == []


# ------------------------------------------------------------------ the key refused, as each server says it

# Answer bodies as the servers send them: LiteLLM's proxy (1.108, recorded), vLLM's --api-key middleware,
# Ollama (its cloud API, and its OpenAI-compatible errors), OpenAI, and OpenRouter.
LITELLM_NO_DB = {"error": {"message": "No connected db.", "type": "no_db_connection", "param": None, "code": "400"}}
REFUSED = {
    "litellm no db (400)": (400, LITELLM_NO_DB),
    "litellm key not found (401)": (401, {"error": {"message": "Authentication Error, Invalid proxy server token "
                                                    "passed. key=88dc28d0f030c55ed4ab77ed8faf098196cb1c05df778539"
                                                    "800c9f1243fe6b4b, not found in db.", "type":
                                                    "token_not_found_in_db", "param": "key", "code": "401"}}),
    "litellm expired key (400)": (400, {"error": {"message": "Authentication Error - Expired Key. Key Expiry time "
                                                  "2026-01-01 00:00:00+00:00", "type": "expired_key",
                                                  "param": "sk-...wxyz", "code": "400"}}),
    "litellm auth error (400)": (400, {"error": {"message": "Authentication Error, Malformed API Key passed in. "
                                                 "Ensure Key has `Bearer ` prefix.", "type": "auth_error",
                                                 "param": "None", "code": "400"}}),
    "vllm (401)": (401, {"error": "Unauthorized"}),
    "ollama cloud (401)": (401, {"error": "unauthorized"}),
    "openai (401)": (401, {"error": {"message": "Incorrect API key provided: sk-wrong. You can find your API key "
                                                "at https://platform.openai.com/account/api-keys.",
                                     "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}),
    "openai-style 400 invalid_api_key": (400, {"error": {"message": "bad key", "type": "invalid_request_error",
                                                         "code": "invalid_api_key"}}),
    "openrouter (401)": (401, {"error": {"message": "User not found.", "code": 401}}),
    "a proxy in front (403)": (403, "<html><body>403 Forbidden</body></html>"),
}
NOT_THE_KEY = {
    "litellm unknown model (400)": (400, {"error": {"message": "/chat/completions: Invalid model name passed in "
                                                    "model=nope. Call `/v1/models` to view available models for "
                                                    "your key.", "type": "invalid_request_error", "param": None,
                                                    "code": "400"}}, None),
    "ollama unknown model (404)": (404, {"error": {"message": "model \"nope\" not found, try pulling it first",
                                                   "type": "api_error", "param": None, "code": None}}, None),
    "vllm context too long (400)": (400, {"object": "error", "message": "This model's maximum context length is "
                                          "4096 tokens. However, you requested 5000 tokens.", "type":
                                          "BadRequestError", "param": None, "code": 400}, None),
    "litellm rate limit (429)": (429, {"error": {"message": "litellm.RateLimitError: this is a mock rate limit "
                                                 "error", "type": "throttling_error", "param": None,
                                                 "code": "429"}}, "unavailable"),
}


@pytest.mark.parametrize("status,body", REFUSED.values(), ids=REFUSED.keys())
def test_the_key_refused_in_any_way_a_server_says_it_is_the_keys_fault(llm, status, body):
    llm.queue({"status": status, "body": body}, "never reached")
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, **FAST)
    assert ei.value.kind == "auth" and ei.value.status == status and ei.value.retryable is False
    assert len(llm.requests) == 1


@pytest.mark.parametrize("status,body,kind", NOT_THE_KEY.values(), ids=NOT_THE_KEY.keys())
def test_an_error_about_the_request_is_not_the_keys(llm, status, body, kind):
    llm.responder = lambda r: {"status": status, "body": body}
    with pytest.raises(ProviderError) as ei:
        chat(req(), base_url=llm.base_url, api_key=KEY, max_attempts=2, **FAST)
    assert ei.value.kind == kind and ei.value.auth is False
