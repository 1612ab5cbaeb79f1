"""Recorded LLM answers, served through the same chokepoint as live ones (tier ``cassette``).

A cassette is JSON: ``{"answers": [{"expect": "# Orient", "content": "..."}, ...]}``.
Answers are served in order; ``expect`` (optional) is a prefix the request's
last message must start with, so a cassette that has drifted from the prompts
fails loudly instead of answering the wrong question. Running out of answers
is a provider error like any other: recorded, never a hang.
"""

from __future__ import annotations

import json
from pathlib import Path

from brainstem.core.errors import ConfigError
from brainstem.llm.openrouter import LLMResponse, ProviderError


class CassetteProvider:
    tier = "cassette"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read cassette {self.path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"cassette {self.path} is not valid JSON: {exc}") from None
        answers = data.get("answers") if isinstance(data, dict) else None
        if not isinstance(answers, list) or not all(isinstance(a, dict) and isinstance(a.get("content"), str)
                                                    for a in answers):
            raise ConfigError(f"cassette {self.path} needs {{\"answers\": [{{\"content\": str}}, ...]}}")
        self.answers = answers
        self.served = 0

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse:
        if self.served >= len(self.answers):
            raise ProviderError(f"cassette {self.path.name} ran out of answers after {self.served}")
        answer = self.answers[self.served]
        asked = request["messages"][-1]["content"]
        expect = answer.get("expect")
        if isinstance(expect, str) and not asked.startswith(expect):
            raise ProviderError(f"cassette {self.path.name} answer {self.served + 1} expects a prompt starting "
                                f"{expect!r}, got {asked[:40]!r}")
        self.served += 1
        content = answer["content"]
        prompt_chars = sum(len(m["content"]) for m in request["messages"])
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": max(1, len(content) // 4),
                 "reasoning_tokens": 0, "cost": None}
        return LLMResponse(content=content, usage=usage, finish_reason="stop", truncated=False,
                           model=request["model"], raw=answer)
