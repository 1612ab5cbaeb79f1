"""Providers: what actually answers an LLM request, tried in order by the chokepoint.

A provider has a ``tier`` (the name karma records: ``dynamic``,
``last_working``, ``hardcoded``, ``cassette``) and ``complete(request,
timeout, deadline)`` returning an :class:`LLMResponse` or raising
:class:`ProviderError`: ``timeout`` bounds one attempt, ``deadline`` (the
session's, a ``time.monotonic()`` value) everything, retries included.
Tests and the offline demo swap the wire (a loopback server, a cassette),
never the chokepoint.
"""

from __future__ import annotations

from typing import Protocol

from brainstem.llm.openrouter import LLMResponse, ProviderError, chat


class Provider(Protocol):
    tier: str

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse: ...


class OpenRouterProvider:
    """Tier 3: the hard-coded client. Nothing in KV can change it."""

    tier = "hardcoded"

    def __init__(self, base_url: str, api_key: str | None, max_attempts: int = 4, backoff_base: float = 1.0):
        self.base_url = base_url
        self._api_key = api_key
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse:
        return chat(request, base_url=self.base_url, api_key=self._api_key, timeout=timeout,
                    max_attempts=self.max_attempts, backoff_base=self.backoff_base,
                    backoff_max=max(1.0, min(30.0, timeout / 2)), deadline=deadline)


__all__ = ["Provider", "OpenRouterProvider", "LLMResponse", "ProviderError"]
