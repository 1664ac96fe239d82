"""Plain decoding with transformers' own `generate`: what every speculative output must equal,
and the speed it is measured against."""

from __future__ import annotations

import torch

from ..repetition import NO_ALLOWANCE, RepetitionAllowance, RepetitionGuard

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


def generate_plainly(
    model, inputs: dict, stop_token_ids: list[int], max_new_tokens: int, repetition_guard: bool = False,
    allowance: RepetitionAllowance = NO_ALLOWANCE, **generate_kwargs,
) -> list[int]:
    """The output tokens of `generate` on one row's processor inputs: greedy, without the
    checkpoint's logit shaping, ending where hsd's loop ends (a stop token, the budget and, where
    asked, the repetition guard, letting through the repetition `allowance` holds)."""
    from transformers import StoppingCriteriaList

    prompt_length = inputs["input_ids"].shape[1]
    stops = [_RepetitionStop(prompt_length, allowance)] if repetition_guard else []
    out = model.generate(
        **inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop_token_ids,
        stopping_criteria=StoppingCriteriaList(stops), **{**plain_generate_overrides(model), **generate_kwargs},
    )
    return out[0, prompt_length:].tolist()
