"""The makers' retry rules as functions of an attempt and its answer: the sampling settings of
attempt k, the reasons an answer is read again, and Chandra's repeat detector."""

from __future__ import annotations

from hsd_cli.recipes.postprocess import PageText
from hsd_cli.recipes.recipe import RetryPolicy


def attempt_temperature(policy: RetryPolicy, attempt: int) -> float:
    """Attempt `attempt`'s temperature (0 the first): the last listed holds for later attempts."""
    return policy.temperatures[min(attempt, len(policy.temperatures) - 1)]


def attempt_top_p(policy: RetryPolicy, attempt: int) -> float:
    return policy.top_ps[min(attempt, len(policy.top_ps) - 1)]


def chandra_repeats_at_end(text: str, base_max_repeats: int = 4, window_size: int = 500,
                           cut_from_end: int = 0, scaling_factor: float = 3.0) -> bool:
    """chandra.model.util.detect_repeat_token (0.2.0): some tail of 1 to window/2 characters is
    repeated back to back more than base * (1 + scaling / length) times."""
    if cut_from_end > 0:
        text = text[:-cut_from_end]
    for length in range(1, window_size // 2 + 1):
        candidate = text[-length:]
        max_repeats = int(base_max_repeats * (1 + scaling_factor / length))
        pos = len(text) - length
        if pos < 0:
            continue
        count = 0
        while pos >= 0 and text[pos:pos + length] == candidate:
            count += 1
            pos -= length
        if count > max_repeats:
            return True
    return False


def chandra_has_repeat(raw: str) -> bool:
    """generate_vllm's retry test: a repeat at the end, or at the end less its last 50 characters."""
    return chandra_repeats_at_end(raw) or (len(raw) > 50 and chandra_repeats_at_end(raw, cut_from_end=50))


def retry_reasons(policy: RetryPolicy, page: PageText, *, stopped: bool, total_tokens: int,
                  raw: str = "", looped: bool = False) -> tuple[str, ...]:
    """Which of the policy's reasons hold for an answer: `stopped` is whether decoding ended on a
    stop token (not the budget), `total_tokens` the prompt's and the answer's. `looped`: hsd's
    repetition guard stopped the answer in a loop, which the makers' decoding would have run on
    into (out of budget, and repeating at its end)."""
    holds = {
        "out_of_budget": not stopped,
        "over_context": policy.context_limit is not None and total_tokens > policy.context_limit,
        "unparsable": not page.valid,
        "rotation_invalid": page.valid and page.fields.get("is_rotation_valid") is False,
        "repeats": "repeats" in policy.retry_when and (looped or chandra_has_repeat(raw)),
    }
    return tuple(reason for reason in policy.retry_when if holds[reason])
