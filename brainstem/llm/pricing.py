"""What a call costs: the worst case before it is sent, the price list's figure after.

Every prompt character is priced as a third of a token (real tokenisers
average about four characters a token, so three over-estimates on purpose)
and every allowed output token as spent; a model with no known price costs as
much as the dearest known one.
"""

from __future__ import annotations

import math

from brainstem.state.config import Models

CHARS_PER_TOKEN_WORST = 3
MIN_USEFUL_TOKENS = 256
ANOMALY_FACTOR = 1.01  # a reported cost this far above the call's worst case is recorded as an anomaly


def worst_case_cost(models: Models, model_id: str, prompt_chars: int, max_tokens: int) -> float:
    p_in, p_out = models.prices(model_id)
    tokens_in = math.ceil(prompt_chars / CHARS_PER_TOKEN_WORST) + 16
    return (tokens_in * p_in + max_tokens * p_out) / 1e6


def listed_cost(models: Models, model_id: str, tokens_in: int, tokens_out: int) -> float:
    p_in, p_out = models.prices(model_id)
    return (tokens_in * p_in + tokens_out * p_out) / 1e6
