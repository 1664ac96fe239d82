"""Typed statistics of the VLM stages: per region, per page, and totals over pages, documents and
runs, with the one definition of the speedup. Counts are deterministic for a model and an input
and go to the page JSON; seconds go to the manifest and the run summary."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the decoding package imports torch, which draft-only workers never load
    from hsd_cli.decoding.repetition import RepetitionLoop
    from hsd_cli.decoding.stats import DecodeStats


def counts_json(stats: DecodeStats) -> dict[str, Any]:
    """A decoded sequence's counts for the page JSON: deterministic for a model and an input, so
    its seconds are left out."""
    return {key: value for key, value in stats.as_dict().items() if not key.endswith("_s")}


@dataclass(frozen=True)
class RegionResult:
    """One block's region pass: the model's reading of the block's crop, verifying its pipeline
    drafts. It drafts the page stage; the user never sees it."""

    block_id: str
    text: str | None  # None where the output looped or was empty: the block's pipeline drafts stand in
    stop_reason: str
    counts: DecodeStats  # its forwards and seconds are shared by the batch the crop was decoded in


def regions_json(regions: tuple[RegionResult, ...]) -> dict[str, Any]:
    """Totals over a page's regions. Forward passes are shared by a batch, so none are summed."""
    proposed = sum(region.counts.proposed for region in regions)
    accepted = sum(region.counts.accepted for region in regions)
    return {
        "count": len(regions),
        "new_tokens": sum(region.counts.new_tokens for region in regions),
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0,
        "looped": sum(region.stop_reason == "repetition" for region in regions),
    }


@dataclass(frozen=True)
class BaselineCheck:
    """The page decoded plainly with transformers' generate (--baseline), against hsd's output."""

    identical: bool  # up to where the repetition guard stopped hsd's output, if it did
    first_divergence: int | None  # the first token where they differ (bf16 near-ties can flip one)
    forwards: int  # one per token: the prefill gives the first
    guard_stopped_at: int | None = None  # hsd's tokens where its repetition guard cut an output generate went on with


@dataclass(frozen=True)
class RotationReads:
    degrees: int  # how far the page was turned (PIL's counter-clockwise transposes, as olmOCR)
    reads: int
    earlier_forwards: int  # forwards of the reads the front matter sent back


@dataclass(frozen=True)
class StageSeconds:
    region_s: float  # 0 where no region pass ran
    page_s: float
    prefill_s: float  # part of page_s
    baseline_page_s: float | None = None  # --baseline only

    def as_json(self) -> dict[str, float]:
        timings = {"region_s": self.region_s, "page_s": self.page_s, "prefill_s": self.prefill_s}
        if self.baseline_page_s is not None:
            timings["baseline_page_s"] = self.baseline_page_s
        return timings


@dataclass(frozen=True)
class PagePlan:
    """The planner's choice for a page (`--stages auto` with a cost profile, stages/planner.py)."""

    chosen: str
    tau: float  # the acceptance the prediction assumed
    predicted_s: dict[str, float]  # every plan's predicted seconds (with its best region set)
    regions: tuple[str, ...] = ()  # the blocks the chosen plan gives a region pass

    def as_json(self) -> dict[str, object]:
        return {
            "chosen": self.chosen, "tau": round(self.tau, 3), "regions": list(self.regions),
            "predicted_s": {k: round(v, 3) for k, v in self.predicted_s.items()},
        }


@dataclass(frozen=True)
class PageStats:
    """What the VLM stages did on one page."""

    page: DecodeStats  # the page stage's last read
    stop_reason: str
    dialect: dict[str, Any]  # the dialect the drafts were written in
    seconds: StageSeconds
    regions: tuple[RegionResult, ...] = ()
    front_matter: dict[str, Any] | None = None
    rotation: RotationReads | None = None  # only where the page was read more than once
    baseline: BaselineCheck | None = None
    plan: PagePlan | None = None  # the planner's choice, where it chose (`--stages auto` with a profile)
    loop: RepetitionLoop | None = None  # where the repetition guard stopped the page stage

    @property
    def verified_drafts(self) -> bool:
        """Whether the page stage verified drafts (not so where the planner chose plain decoding)."""
        return self.plan is None or self.plan.chosen != "plain"

    def as_json(self) -> dict[str, Any]:
        """The page JSON's `stats`: counts (and the planner's predicted seconds, which a profile
        fixes); no measured seconds."""
        stats: dict[str, Any] = {"page": counts_json(self.page), "stop_reason": self.stop_reason, "dialect": self.dialect}
        if self.front_matter is not None:
            stats["front_matter"] = self.front_matter
        if self.rotation is not None:
            stats["rotation"] = vars(self.rotation).copy()
        if self.regions:
            stats["regions"] = regions_json(self.regions)
        if self.baseline is not None:
            stats["baseline"] = vars(self.baseline).copy()
        if self.plan is not None:
            stats["plan"] = self.plan.as_json()
        if self.loop is not None:
            stats["repetition"] = vars(self.loop).copy()
        return stats


@dataclass(frozen=True)
class Speedup:
    value: float
    kind: str  # "measured", or how the value was estimated


@dataclass(frozen=True)
class DecodingTotals:
    """Page-stage counts and VLM seconds over pages (of a document, or of a run)."""

    pages: int
    forwards: int
    new_tokens: int
    region_s: float
    page_s: float
    baseline_page_s: float | None  # only when every page ran --baseline

    @classmethod
    def of(cls, pages: Iterable[PageStats]) -> DecodingTotals | None:
        stats = list(pages)
        if not stats:
            return None
        baselines = [page.seconds.baseline_page_s for page in stats]
        return cls(
            pages=len(stats),
            forwards=sum(page.page.forwards for page in stats),
            new_tokens=sum(page.page.new_tokens for page in stats),
            region_s=sum(page.seconds.region_s for page in stats),
            page_s=sum(page.seconds.page_s for page in stats),
            baseline_page_s=None if None in baselines else sum(baselines),
        )

    def __add__(self, other: DecodingTotals) -> DecodingTotals:
        both = None if self.baseline_page_s is None or other.baseline_page_s is None else self.baseline_page_s + other.baseline_page_s
        return DecodingTotals(
            self.pages + other.pages, self.forwards + other.forwards, self.new_tokens + other.new_tokens,
            self.region_s + other.region_s, self.page_s + other.page_s, both,
        )

    @property
    def tau(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def speedup(self) -> Speedup:
        """Plain page decoding (--baseline) against every VLM stage hsd ran for the same pages
        (region passes included: they are what buys the page's drafts). Without a baseline the
        speedup is unknown; tau bounds it from above."""
        if self.baseline_page_s is None:
            return Speedup(round(self.tau, 3), "estimate (tau; tree forwards cost more)")
        spent = self.region_s + self.page_s
        return Speedup(round(self.baseline_page_s / spent, 3) if spent else 0.0, "measured")

    def as_json(self) -> dict[str, Any]:
        totals: dict[str, Any] = {
            "pages": self.pages, "forwards": self.forwards, "new_tokens": self.new_tokens,
            "region_s": round(self.region_s, 3), "page_s": round(self.page_s, 3),
        }
        if self.baseline_page_s is not None:
            totals["baseline_page_s"] = round(self.baseline_page_s, 3)
        totals["tau"] = round(self.tau, 3)
        totals["speedup"] = vars(self.speedup).copy()
        return totals
