"""Recorded LLM answers, served through the same chokepoint as live ones (tier ``cassette``).

A cassette is JSON: ``{"answers": [{"expect": "# Orient", "content": "..."}, ...]}``.
An answer may call tools instead (``"tool_calls": [{"name": "kv_read", "arguments":
{"key": "wisdom"}}]``), as a model does when an ``agent`` step offers them.
Answers are served in order; ``expect`` (optional) is a prefix the request's
last message must start with, so a cassette that has drifted from the prompts
fails loudly instead of answering the wrong question. Running out of answers
is a provider error like any other: recorded, never a hang.

A cassette's answers are *simulated*: they move no money, so the chokepoint
charges them to the session's budget but never to today's spend. Each session
gets a provider of its own, so each starts from the cassette's first answer. A replay
(``brainstem replay --live --llm-cassette``) passes over the answers of the calls it answers from
its recording (:meth:`CassetteProvider.skip`), so the n-th answer still answers the n-th call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from brainstem.core.errors import ConfigError
from brainstem.llm.messages import last_text, parse_tool_calls, request_chars
from brainstem.llm.openrouter import LLMResponse, ProviderError


class CassetteProvider:
    tier = "cassette"
    simulated = True  # answers move no money: the session's budget counts them, today's spend never

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read cassette {self.path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"cassette {self.path} is not valid JSON: {exc}") from None
        answers = data.get("answers") if isinstance(data, dict) else None
        if not isinstance(answers, list) or not all(
                isinstance(a, dict) and (isinstance(a.get("content"), str) or isinstance(a.get("tool_calls"), list))
                for a in answers):
            raise ConfigError(f"cassette {self.path} needs {{\"answers\": [{{\"content\": str}} or "
                              f"{{\"tool_calls\": [...]}}, ...]}}")
        self.answers = answers
        self.served = 0

    def skip(self) -> None:
        """Pass over the next answer: its call was answered otherwise. A replay answers the calls that did
        not change from its recording, so the cassette's answers keep their places in the session."""
        self.served += 1

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse:
        if self.served >= len(self.answers):
            raise ProviderError(f"cassette {self.path.name} ran out of answers after {self.served}")
        answer = self.answers[self.served]
        asked = last_text(request)
        expect = answer.get("expect")
        if isinstance(expect, str) and not asked.startswith(expect):
            raise ProviderError(f"cassette {self.path.name} answer {self.served + 1} expects a prompt starting "
                                f"{expect!r}, got {asked[:40]!r}")
        self.served += 1
        content = answer.get("content") or ""
        calls = parse_tool_calls(answer.get("tool_calls")) if request.get("tool_choice") != "none" else []
        calls = [{**c, "id": f"call_{self.served}_{i}"} for i, c in enumerate(calls)]
        answer_chars = len(content) + sum(len(c["arguments"]) for c in calls)
        usage = {"prompt_tokens": request_chars(request) // 4, "completion_tokens": max(1, answer_chars // 4),
                 "reasoning_tokens": 0, "cost": None}
        return LLMResponse(content=content, usage=usage, finish_reason="tool_calls" if calls else "stop",
                           truncated=False, model=request["model"], raw=answer, tool_calls=calls)
