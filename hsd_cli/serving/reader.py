"""The narrow face of the model runtime that the stages call: a `Reader` reads pictures with a
prompt, verifying drafts, or plainly. The stages know nothing else of the runtime; a wrapper (a
benchmark stand-in's, named by `ModelConfig.reader_wrapper`) can stand between them."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from PIL import Image

    from hsd_cli.decoding import (
        DecodeConfig, DecodeRequest, DecodeResult, DecodeStats, LoadSizer, LogitsRules, NearLossless, SamplingConfig,
    )
    from hsd_cli.decoding.proposer import Proposer
    from hsd_cli.decoding.repetition import RepetitionAllowance
    from hsd_cli.models.family_settings import ModelSettings
    from hsd_cli.profiles import Profile
    from hsd_cli.recipes.recipe import Decoding, Recipe, Render
    from hsd_cli.records.kinds import ReaderNote


class PageTimedOut(Exception):
    """The page ran past its deadline (--page-timeout): its rows left the batch unfinished."""


class Reader(Protocol):
    settings: ModelSettings  # the family's prompts, drafts' dialect and matching
    profile: Profile | None  # what a step and a prefill cost (None: no profile)
    decode_config: DecodeConfig  # the token budget and the repetition guard
    near_lossless: float | None  # --near-lossless TAU; the stages give the rule its policy (None: lossless)
    recipe: Recipe  # how the model's makers feed it and read its answer (hsd_cli.recipes)
    picture_render: Render | None  # how the recipe renders a page for the model; None: as the draft renders it

    def encode(self, text: str) -> list[int]: ...

    def decode_text(self, tokens: Sequence[int]) -> str: ...

    def prompt_tokens(self, picture: Image.Image, prompt: str) -> int:
        """The tokens of the prompt the model reads for (picture, prompt), the image's included."""

    def proposer(self, drafts: Sequence[str], *, growing: bool = False) -> Proposer:
        """The drafts as a proposer of this model's tokens, matched as the family's settings say."""

    def allowance(self, drafts: Sequence[str]) -> RepetitionAllowance:
        """The repetitions the drafts hold, which the repetition guard lets through as structure."""

    def result(self, tokens: list[int], stats: DecodeStats, stop_reason: str) -> DecodeResult:
        """A plain decoding's tokens as a result (its text ends where a loop began)."""

    def sizer(self, picture: Image.Image) -> LoadSizer | None: ...

    def page_deadline(self, deadline: float | None) -> AbstractContextManager[None]:
        """This thread's reads stop at `deadline` (time.monotonic(); None: no limit)."""

    def attempt(self, attempt: int) -> AbstractContextManager[None]:
        """This thread's reads decode as the recipe's attempt `attempt` (0 the first; recipes.retry)."""

    def attempt_sampling(self, attempt: int) -> SamplingConfig:
        """The sampling attempt `attempt` decodes with (greedy: its answer is any greedy attempt's)."""

    def logits_rules(self, decoding: Decoding) -> LogitsRules:
        """A recipe's decoding rules in this model's token ids (a request's own, where one kind of
        read decodes by other rules than the recipe's: a two-step model's tables)."""

    def decode(
        self, picture: Image.Image, prompt: str, drafts: Sequence[str], near_lossless: NearLossless | None = None,
    ) -> DecodeResult: ...

    def decode_batch(
        self, requests: Sequence[DecodeRequest], *, separate_prefill: bool = False, sizer: LoadSizer | None = None,
    ) -> list[DecodeResult]:
        """Raises PageTimedOut where the page's deadline stopped the requests."""

    def generate_plainly(
        self, picture: Image.Image, prompt: str, max_new_tokens: int, repetition_guard: bool = False,
        allowance: RepetitionAllowance = ...,
    ) -> list[int]: ...

    def page_note(self, picture: Image.Image) -> ReaderNote | None:
        """What the reader itself says of its reading of this page (a flag and a notice), if anything."""
