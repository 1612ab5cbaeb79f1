"""What a call costs: the worst case before it is sent, the price list's figure after.

Every prompt character is priced as a third of a token (real tokenisers
average about four characters a token, so three over-estimates on purpose)
and every allowed output token as spent; a model with no known price costs as
much as the dearest known one. A content part that is not text (an image,
audio, a file) is billed apart from tokens: it costs the model's
``input_cost_per_part``, and where the price list gives none it cannot be priced.
A request marked for prompt caching may be billed for writing all of its
prompt to the cache, so its worst case prices every prompt token at the
dearest of the input price and the marked lifetimes' write price, and never
assumes a cache hit.
"""

from __future__ import annotations

import math

from brainstem.llm.cache import cache_tokens, prompt_split
from brainstem.state.config import Models

CHARS_PER_TOKEN_WORST = 3
IMPLAUSIBLE_SHARE = 0.25  # reported prompt tokens under this share of the runtime's estimate are not believed
MIN_USEFUL_TOKENS = 256
ANOMALY_FACTOR = 1.01  # a reported cost this far above the call's worst case is recorded as an anomaly
OVERRUN_SLACK = 1e-9  # USD: rounding, not a bill above its reservation


def worst_case_cost(models: Models, model_id: str, prompt_chars: int, max_tokens: int, parts_usd: float = 0.0,
                    write_per_mtok: float = 0.0) -> float:
    """``write_per_mtok``: the cache write price of a request marked for caching (0 when it is not)."""
    p_in, p_out = models.prices(model_id)
    tokens_in = math.ceil(prompt_chars / CHARS_PER_TOKEN_WORST) + 16
    return (tokens_in * max(p_in, write_per_mtok) + max_tokens * p_out) / 1e6 + parts_usd


def parts_cost(models: Models, model_id: str, parts: int) -> float | None:
    """What ``parts`` content parts that are not text cost; None when the model has no part price."""
    if parts <= 0:
        return 0.0
    price = models.part_price(model_id)
    return None if price is None else parts * price


def overran(cost: float, worst: float) -> bool:
    """A bill above what was reserved for it."""
    return cost > worst + OVERRUN_SLACK


def estimated_tokens(chars: int) -> int:
    """The runtime's own estimate of the tokens in ``chars`` characters (pessimistic: three a token)."""
    return math.ceil(chars / CHARS_PER_TOKEN_WORST)


def implausible_prompt(usage: dict, prompt_chars: int) -> int | None:
    """The runtime's estimate of the prompt's tokens when the usage a server reported is implausibly below it
    (under a quarter: a mock or a broken proxy counting a fixed few), else None. A reply with no usage at all
    is priced from the text anyway, so it is not this."""
    tokens_in, tokens_out = reported_prompt_tokens(usage), usage.get("completion_tokens", 0)
    estimate = estimated_tokens(prompt_chars)
    if not (tokens_in or tokens_out) or tokens_in >= estimate * IMPLAUSIBLE_SHARE:
        return None
    return estimate


def listed_cost(models: Models, model_id: str, tokens_in: int, tokens_out: int, read: int = 0, written: int = 0,
                write_per_mtok: float | None = None) -> float:
    """The price list's cost of a call: ``tokens_in`` prompt tokens in all, ``read`` of them from the prompt
    cache and ``written`` to it (at ``write_per_mtok``). Cache tokens of a model with no cache prices are
    priced as input, and written ones never below it."""
    p_in, p_out = models.prices(model_id)
    cache = models.cache_prices(model_id)
    uncached, read, written = prompt_split(tokens_in, read, written)
    p_read = cache.read if cache is not None else p_in
    p_write = max(p_in, write_per_mtok if write_per_mtok is not None else
                  (max(cache.write.values()) if cache is not None else p_in))
    return (uncached * p_in + read * p_read + written * p_write + tokens_out * p_out) / 1e6


def reported_prompt_tokens(usage: dict) -> int:
    """The prompt tokens a usage report accounts for, cached and written ones included."""
    uncached, read, written = prompt_split(usage.get("prompt_tokens", 0), *cache_tokens(usage))
    return uncached + read + written
