"""What a call costs: the worst case before it is sent, the price list's figure after.

Every prompt character is priced as a third of a token (real tokenisers
average about four characters a token, so three over-estimates on purpose)
and every allowed output token as spent; a model with no known price costs as
much as the dearest known one. A content part that is not text (an image,
audio, a file) is billed apart from tokens: it costs the model's
``input_cost_per_part``, and where the price list gives none it cannot be priced.
"""

from __future__ import annotations

import math

from brainstem.state.config import Models

CHARS_PER_TOKEN_WORST = 3
MIN_USEFUL_TOKENS = 256
ANOMALY_FACTOR = 1.01  # a reported cost this far above the call's worst case is recorded as an anomaly
OVERRUN_SLACK = 1e-9  # USD: rounding, not a bill above its reservation


def worst_case_cost(models: Models, model_id: str, prompt_chars: int, max_tokens: int, parts_usd: float = 0.0) -> float:
    p_in, p_out = models.prices(model_id)
    tokens_in = math.ceil(prompt_chars / CHARS_PER_TOKEN_WORST) + 16
    return (tokens_in * p_in + max_tokens * p_out) / 1e6 + parts_usd


def parts_cost(models: Models, model_id: str, parts: int) -> float | None:
    """What ``parts`` content parts that are not text cost; None when the model has no part price."""
    if parts <= 0:
        return 0.0
    price = models.part_price(model_id)
    return None if price is None else parts * price


def overran(cost: float, worst: float) -> bool:
    """A bill above what was reserved for it."""
    return cost > worst + OVERRUN_SLACK


def listed_cost(models: Models, model_id: str, tokens_in: int, tokens_out: int) -> float:
    p_in, p_out = models.prices(model_id)
    return (tokens_in * p_in + tokens_out * p_out) / 1e6
