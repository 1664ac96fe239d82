"""The model a worker loads once and every stage reads through (the `Reader` of serving.reader):
the target, the batching engine that the documents in flight share, the page deadlines and the
load sizers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from functools import cache
from importlib import import_module

from PIL import Image

from hsd_cli.config import ModelConfig, Sizing
from hsd_cli.decoding import (
    DecodeConfig, DecodeRequest, StoreConfig, LogitsRules, SamplingConfig, DecodeResult, DecodeStats, LoadSizer, ReadSizers, decode_batch, decode_result,
    NearLossless, draft_allowance, load_target, make_proposer,
)
from hsd_cli.decoding.hf_target.families import ChatLayout
from hsd_cli.decoding.proposer import Proposer
from hsd_cli.models.family_settings import ModelSettings, settings_for
from hsd_cli.profiles import load_profile, square_side
from hsd_cli.recipes.messages import image_first
from hsd_cli.recipes.recipe import Decoding, Recipe
from hsd_cli.recipes.retry import attempt_temperature, attempt_top_p
from hsd_cli.recipes.registry import is_family_default, recipe_named
from hsd_cli.records.kinds import ReaderNote
from hsd_cli.decoding.repetition import NO_ALLOWANCE, RepetitionAllowance
from hsd_cli.serving.pipeline_lock import released, waited_s
from hsd_cli.serving.reader import PageTimedOut, Reader

# Per thread (a page each): the time.monotonic() past which the page's reads stop (None: no limit),
# and the thread's seconds waited for other documents' turns by then (the deadline moves by more).
_page_deadline: ContextVar[tuple[float | None, float]] = ContextVar("page_deadline", default=(None, 0.0))
# A retry's seed is the run's seed times this plus the attempt: distinct for fewer attempts.
ATTEMPT_SEEDS = 64
# Per thread: the recipe's attempt (recipes.retry) the page's reads decode as; 0 the first.
_attempt: ContextVar[int] = ContextVar("attempt", default=0)


class VlmModel:
    """One loaded model, reused for every page a worker converts."""

    def __init__(self, config: ModelConfig, rows: int = 1, sizing: Sizing = Sizing.PAGE) -> None:
        self.config = config
        self.recipe = recipe_named(config.recipe, config.family)
        prompt = self.recipe.prompt
        self.target = load_target(
            config.model, device=config.device, dtype=config.dtype, trust_remote_code=config.trust_remote_code,
            layout=ChatLayout(image_first=image_first(prompt), system=prompt.system),
            kv_store=None if config.kv_store_slots is None else StoreConfig(slots=config.kv_store_slots),
        )
        self.picture_render = None if is_family_default(self.recipe) else self.recipe.render
        # The recipe's page prompt (the family's own where the recipe is the family's default).
        self.settings: ModelSettings = replace(settings_for(self.target.model_type), page_prompt=prompt.text)
        self.target.stop_token_ids = _stop_ids(self.target, self.recipe)
        self.decode_config = recipe_decode_config(self.recipe, config, self.target.tokenizer)
        self.near_lossless = config.near_lossless
        self.layout_model = _layout_model(config, self.recipe)
        self.profile = load_profile(config.profile) if config.profile else None
        self.engine = None
        if rows > 1:
            from hsd_cli.decoding.engine import BatchingEngine

            self.engine = BatchingEngine(self.target, self.decode_config, max_rows=rows)
        self.read_sizers = ReadSizers(self.profile.step_s, rows, sizing is Sizing.BATCH) if self.profile else None

    def encode(self, text: str) -> list[int]:
        return self.target.encode(text)

    def decode_text(self, tokens: Sequence[int]) -> str:
        return self.target.decode(list(tokens))

    def prompt_tokens(self, picture: Image.Image, prompt: str) -> int:
        return self.target.prompt_length(picture, prompt)

    def proposer(self, drafts: Sequence[str], *, growing: bool = False) -> Proposer:
        return make_proposer(self.target, drafts, self.settings.draft_match, growing=growing)

    def allowance(self, drafts: Sequence[str]) -> RepetitionAllowance:
        return draft_allowance(self.target, drafts)

    def result(self, tokens: list[int], stats: DecodeStats, stop_reason: str) -> DecodeResult:
        return decode_result(self.target, tokens, stats, stop_reason)

    def sizer(self, picture: Image.Image) -> LoadSizer | None:
        """With a cost profile, each step verifies as many draft nodes as the profile prices best
        (decoding/sizing.py), per page or for the whole batch as --sizing says (ReadSizers: a page
        sized per page is priced at --max-rows rows, whichever pages share its forwards); without
        one, whole trees."""
        if self.read_sizers is None:
            return None
        return self.read_sizers.sizer(self.profile.prefill_tokens(square_side(*picture.size)))

    @contextmanager
    def page_deadline(self, deadline: float | None) -> Iterator[None]:
        """The reads of this thread's page stop at `deadline` (time.monotonic(); None: no limit)."""
        token = _page_deadline.set((deadline, waited_s()))
        try:
            yield
        finally:
            _page_deadline.reset(token)

    @contextmanager
    def attempt(self, attempt: int) -> Iterator[None]:
        """This thread's reads decode as the recipe's attempt `attempt` (0 the first)."""
        token = _attempt.set(attempt)
        try:
            yield
        finally:
            _attempt.reset(token)

    def attempt_sampling(self, attempt: int) -> SamplingConfig:
        return attempt_sampling(self.recipe, self.config, self.decode_config.sampling, attempt)

    def logits_rules(self, decoding: Decoding) -> LogitsRules:
        return decoding_rules(decoding, self.target.tokenizer)

    def decode_batch(
        self, requests: Sequence[DecodeRequest], *, separate_prefill: bool = False, sizer: LoadSizer | None = None,
    ) -> list[DecodeResult]:
        """The requests decoded together: in the worker's shared batch when there is one (the
        thread lets the other documents' threads run their pipeline while it waits), else on their own;
        as this thread's attempt samples. Raises PageTimedOut where the page's deadline stopped them."""
        deadline, waited_before = _page_deadline.get()
        if deadline is not None:
            deadline += waited_s() - waited_before
        sampling = self.attempt_sampling(_attempt.get())
        requests = [replace(request, deadline=deadline, sampling=sampling) for request in requests]
        if self.engine is None:
            results = decode_batch(self.target, requests, self.decode_config, separate_prefill=separate_prefill, sizer=sizer)
        else:
            with released():
                results = self.engine.decode_batch(requests, sizer=sizer)
        if any(result.stop_reason == "deadline" for result in results):
            raise PageTimedOut
        return results

    def decode(
        self, picture: Image.Image, prompt: str, drafts: Sequence[str], near_lossless: NearLossless | None = None,
    ) -> DecodeResult:
        """One picture read, verifying `drafts` (matched as the family's settings say), under
        the near-lossless rule where one is given."""
        request = DecodeRequest(
            picture, prompt, self.proposer(drafts), allowance=self.allowance(drafts), near_lossless=near_lossless,
        )
        return self.decode_batch([request], sizer=self.sizer(picture))[0]

    def generate_plainly(
        self, picture: Image.Image, prompt: str, max_new_tokens: int, repetition_guard: bool = False,
        allowance: RepetitionAllowance = NO_ALLOWANCE,
    ) -> list[int]:
        """transformers' own generate, with the model to itself between the shared batch's steps;
        its repetition guard lets through the repetition `allowance` holds (`draft_allowance`), and
        it decodes with the recipe's logits rules and this thread's attempt's sampling, as the
        speculative reads do."""
        rules, sampling = self.decode_config.rules, self.attempt_sampling(_attempt.get())
        if self.engine is None:
            return self.target.generate_plainly(
                picture, prompt, max_new_tokens, repetition_guard, allowance, rules=rules, sampling=sampling,
            )
        with released(), self.engine.exclusive():
            return self.target.generate_plainly(
                picture, prompt, max_new_tokens, repetition_guard, allowance, rules=rules, sampling=sampling,
            )

    def page_note(self, picture: Image.Image) -> ReaderNote | None:
        return None


def _layout_model(config: ModelConfig, recipe: Recipe) -> Callable[[Image.Image], list] | None:
    """The blocks the layout model finds in a picture, at its makers' threshold (None: no layout model)."""
    if config.layout_model is None:
        return None
    from hsd_cli.models.layout import LayoutModel

    return LayoutModel(config.layout_model, device=config.device, threshold=recipe.two_step.layout.threshold).blocks


def attempt_sampling(recipe: Recipe, config: ModelConfig, first: SamplingConfig, attempt: int) -> SamplingConfig:
    """How attempt `attempt` samples: the first (`first`) as the recipe decodes; a retry at the
    makers' temperature and top-p for it, keyed by a seed of its own (a retry at the same
    temperature draws anew, as the makers' does); greedy throughout under --greedy."""
    if attempt == 0 or config.greedy:
        return first
    temperature = attempt_temperature(recipe.retry, attempt)
    if temperature <= 0:
        return SamplingConfig()
    return SamplingConfig(
        temperature=temperature, top_k=recipe.decoding.top_k or 0, top_p=attempt_top_p(recipe.retry, attempt),
        seed=config.seed * ATTEMPT_SEEDS + attempt,
    )


def _stop_ids(target, recipe: Recipe) -> list[int]:
    """The target's stop tokens and the recipe's (Chandra's makers stop on <|im_end|> too)."""
    extra = [target.tokenizer.convert_tokens_to_ids(token) for token in recipe.decoding.stop]
    known = [token_id for token_id in extra if isinstance(token_id, int) and token_id != target.tokenizer.unk_token_id]
    return list(dict.fromkeys([*target.stop_token_ids, *known]))


def decoding_rules(decoding: Decoding, tokenizer) -> LogitsRules:
    """A recipe's decoding rules as the decoding core applies them (along each tree node's own
    path, losslessly)."""
    ban = decoding.ngram_ban
    return LogitsRules(
        repetition_penalty=decoding.repetition_penalty,
        presence_penalty=decoding.presence_penalty,
        frequency_penalty=decoding.frequency_penalty,
        no_repeat_ngram=ban.n if ban else 0,
        ngram_window=ban.window if ban else 0,
        ngram_allowed=tuple(tokenizer.convert_tokens_to_ids(token) for token in ban.allowed) if ban else (),
        ngram_over_prompt=False,  # the makers' vLLM processors ban n-grams of the output (DeepSeek, MinerU)
    )


def recipe_decode_config(recipe: Recipe, config: ModelConfig, tokenizer) -> DecodeConfig:
    """How the recipe's makers decode, as the decoding core takes it: their logits rules and their
    sampling through the keyed sampler (greedy where --greedy says so, or the makers sample at
    temperature 0)."""
    decoding = recipe.decoding
    sampled = decoding.temperature > 0 and not config.greedy
    sampling = SamplingConfig(
        temperature=decoding.temperature, top_k=decoding.top_k or 0, top_p=decoding.top_p, seed=config.seed,
    ) if sampled else SamplingConfig()
    return DecodeConfig(max_new_tokens=config.max_new_tokens, sampling=sampling, rules=decoding_rules(decoding, tokenizer))


@cache
def shared_reader(config: ModelConfig, rows: int, sizing: Sizing) -> Reader:
    """The worker's reader for these configs: the model loads once per worker process, wrapped as
    `config.reader_wrapper` names (a "module:callable" taking the reader and the config)."""
    reader: Reader = VlmModel(config, rows, sizing)
    if config.reader_wrapper:
        module, name = config.reader_wrapper.split(":")
        reader = getattr(import_module(module), name)(reader, config)
    return reader
