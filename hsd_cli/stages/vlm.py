"""The VLM stages: regions (each block's crop, verifying its pipeline draft) and the page
(verifying the region outputs). Only the page output reaches the user; region outputs are drafts.

Knows nothing about trees: it hands images, prompts and draft texts to the decoding core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from PIL import Image

from hsd_cli.decoding import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    UnsupportedTransformersError,
    check_cache_layout,
    decode,
    decode_many,
    load_target,
)
from hsd_cli.models.settings import ModelSettings, model_type_of, settings_for
from hsd_cli.records import Block, PageImage
from hsd_cli.replay.fingerprint import replay_fingerprint_check
from hsd_cli.stages.dialect import DIALECT_KEYS, block_drafts, draft_plan, front_matter_drafts, settled, split_front_matter
from hsd_cli.stages.rasterize import crop_block

REGION_BATCH = 8
# A page whose front matter says it is rotated is turned by the model's correction and read again,
# as olmOCR does (its pipeline turns the image with these transposes, up to 8 reads; hsd: 4).
ROTATION_REREADS = 3
_TURN = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}
# Flag of a page that a replay model (a benchmark stand-in) was not built on.
OUTSIDE_REPLAY_SET = "outside_replay_set"


@dataclass(frozen=True)
class VlmOptions:
    model: str
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    max_new_tokens: int | None = None  # None: the family's setting
    baseline: bool = False  # also decode plainly, to measure the speedup


@dataclass(frozen=True)
class VlmPageOutput:
    text: str | None  # None when the model output was unusable (the draft stands in)
    rejected_text: str | None  # the unusable output (empty, or cut where it looped); None when used
    flags: tuple[str, ...]
    stats: dict[str, Any]  # counts: deterministic for a given model and input
    timings: dict[str, float]  # seconds: go to the manifest


class ModelUnavailableError(RuntimeError):
    """The model, the device or the installed transformers cannot be used; raised before any
    work (exit code 4)."""

    def __init__(self, message: str, hint: str | None = "give a local model directory, or a hub id that is in the HF cache"):
        super().__init__(message)
        self.hint = hint


def preflight(options: VlmOptions) -> str:
    """Check, without loading weights, that the model resolves, the device exists and the
    installed transformers is one the decoder knows; returns the model family (`model_type`).
    A family settings file that cannot be used raises ModelSettingsError here, once, rather than
    failing every page in the workers."""
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
    settings_for(family)
    return family


class VlmStages:
    """One loaded model, reused for every page a worker converts."""

    @staticmethod
    @cache
    def shared(options: VlmOptions) -> VlmStages:
        """The worker's instance for these options: the model loads once per worker process."""
        return VlmStages(options)

    def __init__(self, options: VlmOptions) -> None:
        self.options = options
        self.target = load_target(
            options.model, device=options.device, dtype=options.dtype, trust_remote_code=options.trust_remote_code
        )
        self.settings: ModelSettings = settings_for(self.target.model_type)
        budget = options.max_new_tokens or self.settings.max_new_tokens
        self.decode_config = DecodeConfig(max_new_tokens=budget)

    def page_drafts(
        self, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool], settings: ModelSettings
    ) -> tuple[list[str], list[DecodeResult]]:
        """Per `draft_plan` block: its region output where a region pass runs, else its pipeline
        text in the family's dialect (alternatives included). Region crops are decoded in batches,
        each verifying its block's dialect drafts."""
        per_block: list[list[str]] = []
        items, slots = [], []
        for block, region in draft_plan(blocks, wants_region):
            texts = block_drafts(block, settings)
            crop = crop_block(image, block.bbox, self.settings.region_padding_px) if region else None
            if crop is not None:
                items.append((crop, self.settings.region_prompt, texts))
                slots.append(len(per_block))
            per_block.append(texts)
        results = decode_many(
            self.target, items, self.decode_config, match=self.settings.draft_match, batch_size=REGION_BATCH
        )
        for slot, result in zip(slots, results, strict=True):
            # A looping region is cut and its pipeline drafts stand in for it.
            if result.stop_reason != "repetition" and result.text.strip():
                per_block[slot] = [result.text]
        drafts = front_matter_drafts(blocks, settings) + [text for texts in per_block for text in texts]
        return drafts, results

    def page(
        self, image: PageImage, blocks: tuple[Block, ...], wants_region: Callable[[Block], bool],
        earlier_outputs: Sequence[str] = (),
    ) -> VlmPageOutput:
        """The page's output; `earlier_outputs` (the document's pages so far) settle its dialect."""
        started = time.perf_counter()
        settings = settled(self.settings, earlier_outputs)
        drafts, region_results = self.page_drafts(image, blocks, wants_region, settings)
        regions_done = time.perf_counter()
        read = self._upright_read(image.image, drafts, settings)
        result = read.result
        page_done = time.perf_counter()
        # Drafting without region passes is bookkeeping, not a region stage: no region seconds.
        timings = {"region_s": regions_done - started if region_results else 0.0, "page_s": page_done - regions_done,
                   "prefill_s": result.stats.prefill_s}
        baseline = None
        if self.options.baseline:
            # transformers' own generate, with the same model, dtype and cache: the baseline a user
            # would otherwise run.
            plain = self.target.generate_plainly(
                read.picture, self.settings.page_prompt, self.decode_config.max_new_tokens,
                self.decode_config.repetition_guard,
            )
            timings["baseline_page_s"] = time.perf_counter() - page_done
            # Exact in fp32; in bf16 a near-tie can flip, so report where instead of asserting.
            divergence = next(
                (i for i, (a, b) in enumerate(zip(plain, result.tokens)) if a != b),
                None if len(plain) == len(result.tokens) else min(len(plain), len(result.tokens)),
            )
            # One forward per token: the prefill gives the first.
            baseline = {"identical": divergence is None, "first_divergence": divergence, "forwards": len(plain)}
        flags: tuple[str, ...] = ("vlm",)
        if not replay_fingerprint_check(self.options.model, image.image):
            flags += (OUTSIDE_REPLAY_SET,)
        if read.rotation:
            flags += ("rotated",)
        text: str | None = read.text
        rejected = None
        if result.stop_reason == "repetition" or not text:
            flags += ("fallback", "repetition" if result.stop_reason == "repetition" else "empty")
            text, rejected = None, text
        elif result.stop_reason == "budget":
            flags += ("truncated",)
        stats: dict[str, Any] = {
            "page": _counts(result.stats), "stop_reason": result.stop_reason,
            "dialect": {name: getattr(settings, name) for name in DIALECT_KEYS},
        }
        if read.front_matter is not None:
            stats["front_matter"] = read.front_matter
        if read.reads > 1:
            stats["rotation"] = {"degrees": read.rotation, "reads": read.reads, "earlier_forwards": read.earlier_forwards}
        if region_results:
            stats["regions"] = _region_counts(region_results)
        if baseline is not None:
            stats["baseline"] = baseline
        return VlmPageOutput(text=text, rejected_text=rejected, flags=flags, stats=stats, timings=timings)

    def _upright_read(self, picture: Image.Image, drafts: list[str], settings: ModelSettings) -> UprightRead:
        """The page stage's decoding of the picture; where the output's front matter says the page
        is rotated, the picture turned by the model's correction and read again."""
        rotation, earlier_forwards, reads = 0, 0, 0
        while True:
            reads += 1
            turned = picture.transpose(_TURN[rotation]) if rotation else picture
            result = decode(self.target, turned, self.settings.page_prompt, drafts, self.decode_config,
                            match=self.settings.draft_match)
            output = result.text.strip()
            # The front matter goes to the JSON; the Markdown is the page's text.
            front_matter, body = split_front_matter(output) if settings.front_matter != "none" else (None, output)
            correction = rotation_correction(front_matter)
            if not correction or reads > ROTATION_REREADS:
                return UprightRead(result, turned, front_matter, body, rotation, reads, earlier_forwards)
            earlier_forwards += result.stats.forwards
            rotation = (rotation + correction) % 360


@dataclass(frozen=True)
class UprightRead:
    result: DecodeResult  # the last read
    picture: Image.Image  # what it read: the page turned by `rotation`
    front_matter: dict[str, Any] | None
    text: str  # its output without the front matter
    rotation: int  # degrees the page was turned (PIL's counter-clockwise transposes, as olmOCR)
    reads: int
    earlier_forwards: int  # forwards of the reads the front matter sent back


def rotation_correction(front_matter: dict[str, Any] | None) -> int:
    """The degrees the front matter says the page must be turned by, 0 where it is upright."""
    if not front_matter or front_matter.get("is_rotation_valid") is not False:
        return 0
    correction = front_matter.get("rotation_correction")
    return correction if correction in _TURN else 0


def _counts(stats: DecodeStats) -> dict[str, Any]:
    """The deterministic part of the statistics (no seconds)."""
    return {key: value for key, value in stats.as_dict().items() if not key.endswith("_s")}


def _region_counts(results: list[DecodeResult]) -> dict[str, Any]:
    """Totals over a page's regions. Forward passes are shared by a batch, so none are summed."""
    proposed = sum(r.stats.proposed for r in results)
    accepted = sum(r.stats.accepted for r in results)
    return {
        "count": len(results),
        "new_tokens": sum(r.stats.new_tokens for r in results),
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0,
        "looped": sum(r.stop_reason == "repetition" for r in results),
    }
