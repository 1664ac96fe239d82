"""The page record the stages fill, in order: rendered (picture), drafted (blocks), planned
(plan), read (reading), and what the user gets (text, flags, notice). Each stage returns the
record with its slots filled; the pipeline (pipeline.py) orders them. A plan and a reading are the
page's other two records; a document is its pages."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from PIL import Image

from hsd_cli.records.blocks import BlockReading
from hsd_cli.records.kinds import Block, Grounding, PageFlag
from hsd_cli.records.totals import BaselineCheck, DecodingTotals, RegionResult

if TYPE_CHECKING:  # the decoding package imports torch, which draft-only workers never load
    from hsd_cli.decoding import DecodeResult, DecodeStats


class Way(StrEnum):
    """How a plan reads a page."""

    DRAFT = "draft"  # not at all: the draft stands in (it would not finish within its time limit)
    PLAIN = "plain"  # transformers' generate, one forward per token
    PAGE = "page"  # the page stage verifying the pipeline's drafts
    REGION_PAGE = "region-page"  # region passes over some blocks' crops, then the page stage
    PACKED = "packed"  # those region passes in the page stage's forwards
    BLOCKS = "blocks"  # two steps, as the makers of MinerU2.5, PaddleOCR-VL, GLM-OCR: the layout, then every block's crop, whose readings are the page


@dataclass(frozen=True)
class Plan:
    """How the model stages read a page: fixed by --stages, or chosen by the planner from a cost
    profile (`--stages auto`), which also predicts every way's seconds."""

    way: Way
    regions: tuple[str, ...] = ()  # the blocks given a region pass, by id
    tau: float | None = None  # the acceptance the planner's prediction assumed; None: not predicted
    predicted_s: dict[str, float] = field(default_factory=dict)  # every way's predicted seconds (with its best region set)

    @property
    def predicted(self) -> bool:
        return self.tau is not None

    @property
    def verifies_drafts(self) -> bool:
        return self.way not in (Way.DRAFT, Way.PLAIN)

    def as_json(self) -> dict[str, object]:
        """The page JSON's `plan`, written where the planner predicted it."""
        return {
            "chosen": self.way.value, "tau": round(self.tau, 3), "regions": list(self.regions),
            "predicted_s": {k: round(v, 3) for k, v in self.predicted_s.items()},
        }


@dataclass(frozen=True)
class ModelInput:
    """What the model read of a page, as its recipe built it."""

    recipe: str
    image_px: tuple[int, int]  # (width, height) of the picture handed to the processor
    prompt_tokens: int  # the prompt's tokens, the image's included

    def as_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "image_px": list(self.image_px), "prompt_tokens": self.prompt_tokens}


@dataclass(frozen=True)
class RetriedRead:
    """An attempt of the page stage whose answer the recipe's makers would not accept, so the page
    was read again at the next attempt's temperature (recipes.retry)."""

    attempt: int  # 0 the first
    reasons: tuple[str, ...]  # recipes.recipe.RETRY_REASONS that held
    forwards: int  # its page-stage forwards (its rotation rereads included)
    new_tokens: int

    def as_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "reasons": list(self.reasons), "forwards": self.forwards, "new_tokens": self.new_tokens}


@dataclass(frozen=True)
class Reading:
    """What the model's stages did on a page: the region passes, then the page stage's reading
    (the last one, where the front matter had the page turned and read again)."""

    result: DecodeResult  # the page stage's last read
    front_matter: dict[str, Any] | None
    text: str  # the output without its front matter and grounding tags
    dialect: dict[str, Any]  # the dialect the drafts were written in
    rotation: int = 0  # degrees the page was turned (PIL's counter-clockwise transposes, as olmOCR)
    earlier: tuple[DecodeStats, ...] = ()  # the reads the front matter sent back, in order
    regions: tuple[RegionResult, ...] = ()
    region_s: float = 0.0  # 0 where no region pass ran (packed: its passes are in page_s)
    page_s: float = 0.0
    baseline: BaselineCheck | None = None  # --baseline only
    baseline_page_s: float | None = None
    grounding: Grounding | None = None  # the layout the output's grounding tags gave, where it has them
    near_lossless: float | None = None  # --near-lossless's TAU where the page stage read with it (None: lossless)
    model_input: ModelInput | None = None  # what the model read: the recipe, the picture's size, the prompt's tokens
    model_text: str | None = None  # the model's text where its recipe's post-processing changed it (`text` is the page's)
    retries: tuple[RetriedRead, ...] = ()  # the attempts before this reading that the makers would not accept
    not_accepted: tuple[str, ...] = ()  # why the makers would not accept this last reading either (its fallback stands in)
    layout: BlockReading | None = None  # the two-step way's layout step, where the model itself read one
    blocks: tuple[BlockReading, ...] = ()  # the two-step way's block readings, in reading order

    @property
    def reads(self) -> int:
        return len(self.earlier) + 1

    @property
    def earlier_forwards(self) -> int:
        return sum(stats.forwards for stats in self.earlier)

    @property
    def forwards(self) -> int:
        """The page stage's forwards, its earlier reads and retried attempts included (region
        passes are not counted)."""
        return self.earlier_forwards + self.result.stats.forwards + sum(retry.forwards for retry in self.retries)

    @property
    def attempt(self) -> int:
        """The recipe's attempt this reading is (0 the first): its temperature and seed."""
        return len(self.retries)

    @property
    def timings(self) -> dict[str, float]:
        timings = {"region_s": self.region_s, "page_s": self.page_s, "prefill_s": self.result.stats.prefill_s}
        if self.baseline_page_s is not None:
            timings["baseline_page_s"] = self.baseline_page_s
        return timings

    @property
    def totals(self) -> DecodingTotals:
        """The last read's counts and its retried attempts' (each decoded as many tokens as it
        took forwards to)."""
        retried_forwards = sum(retry.forwards for retry in self.retries)
        retried_tokens = sum(retry.new_tokens for retry in self.retries)
        return DecodingTotals(
            pages=1, forwards=self.result.stats.forwards + retried_forwards,
            new_tokens=self.result.stats.new_tokens + retried_tokens,
            region_s=self.region_s, page_s=self.page_s, baseline_page_s=self.baseline_page_s,
        )


@dataclass(frozen=True)
class Page:
    """One page, its slots filled stage by stage (None or empty until its stage has run)."""

    page_no: int  # 1-based
    size_pt: tuple[float, float]
    picture: Image.Image | None = None  # the rendering; dropped once the page is done
    # The page as the model's makers render it for the model, where that differs from `picture`
    # (the draft's rendering); dropped with it.
    model_picture: Image.Image | None = None
    scale: float = 1.0  # pixels per PDF point
    blocks: tuple[Block, ...] = ()  # the draft, in reading order
    backend: str = "none"  # the draft backend that ran (auto resolves to pdf-text or ocr)
    figures: tuple[tuple[str, Image.Image], ...] = ()  # (block id, crop) for figures
    plan: Plan | None = None  # None: no model runs
    reading: Reading | None = None  # None: the model did not read the page
    text: str | None = None  # the model's reading as the user gets it; None: the draft blocks are the text
    flags: tuple[PageFlag | str, ...] = ()  # a str: a reader's own flag (records.kinds.ReaderNote)
    draft_from: int | None = None  # the first of `blocks` whose draft follows a reading the model broke off
    notice: str | None = None  # the one line a user is told where the page is not the model's full reading
    timings: dict[str, float] = field(default_factory=dict)

    def without_picture(self) -> Page:
        """What a checkpoint and the finished document keep: the rendering is megabytes a page."""
        return replace(self, picture=None, model_picture=None)

    @property
    def model_view(self) -> Image.Image | None:
        """The picture the model reads the whole page from."""
        return self.picture if self.model_picture is None else self.model_picture

    def without_figures(self) -> Page:
        """What a document holds of a page checkpointed with its figures until it is written (their
        crops are read back from the checkpoint then): a long document's figures would otherwise
        pile up in memory, megabytes a page."""
        return replace(self, figures=())


@dataclass(frozen=True)
class DocumentResult:
    pages: tuple[Page, ...]
    page_count: int  # pages in the document (converted pages may be a subset)
    metadata: dict[str, Any]
    warnings: tuple[str, ...] = ()
    damaged: bool = False  # the source (an image cut short) decoded only in part
    tracebacks: tuple[str, ...] = ()  # of the pages that raised (shown with --debug)
    parts: int = 1  # over 1: the pages are one part's of a split document, which its assembly writes
