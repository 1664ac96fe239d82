"""Plain decoding with transformers' own `generate`: what every speculative output must equal,
and the speed it is measured against."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..repetition import NO_ALLOWANCE, RepetitionAllowance, RepetitionGuard
from ..logits_rules import LogitsRules, apply_rules_
from ..verify import SamplingConfig, keyed_sample

# generation_config fields that change which token `generate` picks even with do_sample=False.
# Checkpoints set some (Qwen's ship repetition_penalty 1.05), which would make a greedy
# `generate` something other than the plain argmax decoding that speculation must equal.
_LOGIT_SHAPING_FIELDS = (
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "min_length", "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
    "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty",
)


def plain_generate_overrides(model) -> dict:
    """`generate` keyword arguments that undo the checkpoint's logit shaping (each field at the
    library default where the checkpoint sets another), so greedy `generate` is plain argmax."""
    from transformers import GenerationConfig

    library = GenerationConfig()
    own = model.generation_config
    return {
        name: getattr(library, name)
        for name in _LOGIT_SHAPING_FIELDS
        if getattr(own, name, None) != getattr(library, name, None)
    }


class _RepetitionStop:
    """hsd's repetition guard as a `generate` stopping criterion (a callable is all `generate`
    asks of one), so that plain decoding stops where hsd's loop stops: the same `RepetitionGuard`,
    with the same allowance, fed the tokens `generate` adds."""

    def __init__(self, prompt_length: int, allowance: RepetitionAllowance) -> None:
        self.prompt_length = prompt_length
        self.guard = RepetitionGuard(allowance)
        self.tokens: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.tokens += input_ids[0, self.prompt_length + len(self.tokens) :].tolist()
        looping = self.guard.stop_after(self.tokens) is not None
        return torch.full((input_ids.shape[0],), looping, dtype=torch.bool, device=input_ids.device)


class _OwnRules:
    """hsd's logits rules as a `generate` logits processor (a callable is all `generate` asks of
    one), for the rules transformers has no processor for: the same function the tree's nodes go
    through (logits_rules.py), at `generate`'s one position per row."""

    def __init__(self, rules: LogitsRules, prompt_length: int) -> None:
        self.rules, self.prompt_length = rules, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float().clone()
        for row, ids in enumerate(input_ids.tolist()):
            apply_rules_(scores[row : row + 1], (0,), (-1,), ids[: self.prompt_length], ids[self.prompt_length :], self.rules)
        return scores


class _KeyedSampling:
    """Plain keyed sampling inside `generate`: the keyed draw for each row's output position
    (verify.keyed_sample), returned as a one-hot score for greedy `generate` to pick."""

    def __init__(self, sampling: SamplingConfig, prompt_length: int) -> None:
        self.sampling, self.prompt_length = sampling, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_length
        chosen = torch.tensor([keyed_sample(row_scores, self.sampling, row, position) for row, row_scores in enumerate(scores)])
        return torch.full_like(scores, float("-inf")).scatter(1, chosen[:, None].to(scores.device), 0.0)


def rules_for_generate(rules: LogitsRules, prompt_length: int) -> tuple[dict, list]:
    """`generate` keywords for the rules transformers has (repetition_penalty; no_repeat_ngram_size
    over prompt + output, no window, nothing allowed), and processors for the rest. `generate`
    runs its own processors first: the repetition penalty before the others, as hsd does."""
    kwargs: dict = {}
    if rules.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = rules.repetition_penalty
        rules = replace(rules, repetition_penalty=1.0)
    if rules.no_repeat_ngram and rules.ngram_over_prompt and not rules.ngram_window and not rules.ngram_allowed:
        kwargs["no_repeat_ngram_size"] = rules.no_repeat_ngram
        rules = replace(rules, no_repeat_ngram=0)
    return kwargs, [_OwnRules(rules, prompt_length)] if rules.active else []


def generate_plainly(
    model, inputs: dict, stop_token_ids: list[int], max_new_tokens: int, repetition_guard: bool = False,
    allowance: RepetitionAllowance = NO_ALLOWANCE, *, rules: LogitsRules = LogitsRules(),
    sampling: SamplingConfig = SamplingConfig(), **generate_kwargs,
) -> list[int]:
    """The output tokens of `generate` on one row's processor inputs: greedy (or keyed
    `sampling`), without the checkpoint's logit shaping but with hsd's logits `rules`, ending where
    hsd's loop ends (a stop token, the budget and, where asked, the repetition guard, letting
    through the repetition `allowance` holds)."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    prompt_length = inputs["input_ids"].shape[1]
    stops = [_RepetitionStop(prompt_length, allowance)] if repetition_guard else []
    rule_kwargs, processors = rules_for_generate(rules, prompt_length)
    if not sampling.greedy:
        processors.append(_KeyedSampling(sampling, prompt_length))
    out = model.generate(
        **inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop_token_ids,
        stopping_criteria=StoppingCriteriaList(stops), logits_processor=LogitsProcessorList(processors),
        **{**plain_generate_overrides(model), **rule_kwargs, **generate_kwargs},
    )
    return out[0, prompt_length:].tolist()
