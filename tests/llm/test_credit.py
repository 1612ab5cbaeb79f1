"""OpenRouter's credit, read from /key then /credits, against the loopback double."""

from __future__ import annotations

import time

import pytest

from brainstem.llm.credit import fetch_credit
from tests.helpers import free_port as closed_port

KEY = "sk-or-v1-SECRETSECRETSECRET0123456789abcdef"


def test_fetch_credit_from_key(llm):
    llm.credit = 7.25
    assert fetch_credit(base_url=llm.base_url, api_key=KEY) == 7.25
    paths = [p for p, _ in llm.get_requests]
    assert paths == ["/api/v1/key"]
    assert {k.lower(): v for k, v in llm.get_requests[0][1].items()}["authorization"] == f"Bearer {KEY}"


def test_fetch_credit_falls_back_to_credits_when_unlimited(llm):
    llm.credit = None
    llm.total_credits, llm.total_usage = 20.0, 4.5
    assert fetch_credit(base_url=llm.base_url, api_key=KEY) == pytest.approx(15.5)
    assert [p for p, _ in llm.get_requests] == ["/api/v1/key", "/api/v1/credits"]


def test_fetch_credit_falls_back_when_key_fails(llm):
    llm.key_status = 401
    llm.total_credits, llm.total_usage = 3.0, 1.0
    assert fetch_credit(base_url=llm.base_url, api_key=KEY) == pytest.approx(2.0)


def test_fetch_credit_none_when_both_fail(llm):
    llm.credit = None
    llm.credits_status = 403
    assert fetch_credit(base_url=llm.base_url, api_key=KEY) is None


def test_fetch_credit_none_when_server_down():
    t0 = time.monotonic()
    assert fetch_credit(base_url=f"http://127.0.0.1:{closed_port()}/api/v1", api_key=KEY, timeout=1) is None
    assert fetch_credit(base_url="not a url", api_key=KEY) is None
    assert time.monotonic() - t0 < 2


def test_fetch_credit_says_why_without_the_key(llm):
    llm.key_status = 401
    llm.credits_status = 403
    why: list[str] = []
    assert fetch_credit(base_url=llm.base_url, api_key=KEY, why=why) is None
    assert why == ["/key: HTTP 401; /credits: HTTP 403"] and KEY not in why[0]
