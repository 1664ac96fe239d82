"""The VLM that the region and page stages share: options, the checks before any work, and the
model loaded once per worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import cache

from PIL import Image

from hsd_cli.decoding import (
    DecodeConfig, DecodeRequest, DecodeResult, LoadSizer, NearLossless, ReadSizers, UnsupportedTransformersError, check_cache_layout, decode_batch,
    load_target, make_proposer,
)
from hsd_cli.decoding.hf_target.families import adapter_for
from hsd_cli.config import Sizing
from hsd_cli.models.family_settings import ModelSettings, model_type_of, settings_for
from hsd_cli.serving.pipeline_lock import released, waited_s
from hsd_cli.profiles import Profile, load_profile, profile_name, square_side


@dataclass(frozen=True)
class VlmOptions:
    model: str
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    max_new_tokens: int | None = None  # None: the family's setting
    baseline: bool = False  # also decode plainly, to measure the speedup
    # Rows in flight: above 1, the pages that the worker's threads read at once share one batch.
    max_rows: int = 1
    sizing: Sizing = Sizing.PAGE  # with max_rows above 1: trees sized per page or for the whole batch (config.Sizing)
    profile: str | None = None  # the cost profile `--stages auto` plans with (None: the stored one of this model, if any)
    # Does the model read this page? A replay model (a benchmark stand-in) recites only the pages it
    # was built on; `hsd convert` gives its check. None: the model reads any page.
    reads_page: Callable[[Image.Image], bool] | None = None
    near_lossless: float | None = None  # --near-lossless TAU (None: lossless); the stages give the rule its policy


class PageTimedOut(Exception):
    """The page ran past its deadline (--page-timeout): its rows left the batch unfinished."""


# Per thread (a page each): the time.monotonic() past which the page's reads stop (None: no limit),
# and the thread's seconds waited for other documents' turns by then (the deadline moves by more).
_page_deadline: ContextVar[tuple[float | None, float]] = ContextVar("page_deadline", default=(None, 0.0))


class ModelUnavailableError(RuntimeError):
    """The model, the device or the installed transformers cannot be used; raised before any
    work (exit code 4)."""

    def __init__(self, message: str, hint: str | None = "give a local model directory, or a hub id that is in the HF cache"):
        super().__init__(message)
        self.hint = hint


def preflight(options: VlmOptions) -> str:
    """Check, without loading weights, that the model resolves, the device exists and the
    installed transformers is one the decoder knows; returns the model family (`model_type`).
    A family hsd does not serve or refuses raises UnsupportedFamilyError, and a family settings
    file that cannot be used SettingsFileError, here, once, rather than failing every document in
    the workers."""
    import torch

    try:
        check_cache_layout()
    except UnsupportedTransformersError as exc:
        raise ModelUnavailableError(str(exc), hint=None) from None

    device = options.device or ""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelUnavailableError(f"--device {device}: no CUDA device is available to this torch", hint=None)
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelUnavailableError("--device mps: MPS is not available", hint=None)
    try:
        family = model_type_of(options.model)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelUnavailableError(f"cannot load model {options.model!r}: {first_line}") from None
    adapter_for(family)
    settings_for(family)
    if options.profile:
        try:
            load_profile(options.profile)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelUnavailableError(
                f"cannot read cost profile {options.profile!r}: {exc}", hint="make one with `hsd profile --model ...`"
            ) from None
    return family


def cost_profile(options: VlmOptions, device: str, dtype: str) -> Profile | None:
    """The profile named by --profile, else the one `hsd profile --model` stored for this model,
    device and dtype; None where there is none (`auto` then plans by a fixed rule)."""
    if options.profile:
        return load_profile(options.profile)
    try:
        return load_profile(profile_name(options.model, device, dtype))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class VlmModel:
    """One loaded model, reused for every page a worker converts."""

    @staticmethod
    @cache
    def shared(options: VlmOptions) -> VlmModel:
        """The worker's instance for these options: the model loads once per worker process."""
        return VlmModel(options)

    def __init__(self, options: VlmOptions) -> None:
        self.options = options
        self.target = load_target(
            options.model, device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code
        )
        self.settings: ModelSettings = settings_for(self.target.model_type)
        budget = options.max_new_tokens or self.settings.max_new_tokens
        self.decode_config = DecodeConfig(max_new_tokens=budget)
        self.profile = cost_profile(options, str(self.target.device), str(self.target.dtype).removeprefix("torch."))
        self.engine = None
        if options.max_rows > 1:
            from hsd_cli.decoding.engine import BatchingEngine

            self.engine = BatchingEngine(self.target, self.decode_config, max_rows=options.max_rows)
        rows = options.max_rows if self.engine is not None else 1
        self.read_sizers = ReadSizers(self.profile.step_s, rows, options.sizing is Sizing.BATCH) if self.profile else None

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

    def decode_batch(
        self, requests: Sequence[DecodeRequest], *, separate_prefill: bool = False, sizer: LoadSizer | None = None,
    ) -> list[DecodeResult]:
        """The requests decoded together: in the worker's shared batch when there is one (the
        thread lets the other documents' threads run their pipeline while it waits), else on their own.
        Raises PageTimedOut where the page's deadline stopped them."""
        deadline, waited_before = _page_deadline.get()
        if deadline is not None:
            deadline += waited_s() - waited_before
        requests = [replace(request, deadline=deadline) for request in requests]
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
        proposer = make_proposer(self.target, drafts, self.settings.draft_match)
        request = DecodeRequest(picture, prompt, proposer, near_lossless=near_lossless)
        return self.decode_batch([request], sizer=self.sizer(picture))[0]

    def generate_plainly(self, picture: Image.Image, prompt: str, max_new_tokens: int, repetition_guard: bool = False) -> list[int]:
        """transformers' own generate, with the model to itself between the shared batch's steps."""
        if self.engine is None:
            return self.target.generate_plainly(picture, prompt, max_new_tokens, repetition_guard)
        with released(), self.engine.exclusive():
            return self.target.generate_plainly(picture, prompt, max_new_tokens, repetition_guard)

    def outside_replay_set(self, picture: Image.Image) -> bool:
        """A replay model (a benchmark stand-in) recites the pages it was built on: is this not one?"""
        return self.options.reads_page is not None and not self.options.reads_page(picture)
