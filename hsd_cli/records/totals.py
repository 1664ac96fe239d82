"""Statistics of the VLM stages: per region, the baseline check, and totals over pages, documents
and runs (tau and the speedup as decoding.stats defines them). Counts are deterministic for a
model and an input and go to the page JSON; seconds go to the manifest and the run summary."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hsd_cli.decoding.stats import DecodeStats, speedup, tau


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
    # Near-lossless readings only (None otherwise): the token edit distance from plain decoding's
    # output (page_stage.token_edit_distance), as far as it was compared.
    changed_tokens: int | None = None

    def as_json(self) -> dict[str, object]:
        """The page JSON's `stats.baseline`; `changed_tokens` only where it was counted."""
        return {key: value for key, value in vars(self).items() if key != "changed_tokens" or value is not None}


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

    @staticmethod
    def total(totals: Iterable[DecodingTotals]) -> DecodingTotals | None:
        """The sum; None over nothing (no page was read)."""
        summed = None
        for part in totals:
            summed = part if summed is None else summed + part
        return summed

    def __add__(self, other: DecodingTotals) -> DecodingTotals:
        both = None if self.baseline_page_s is None or other.baseline_page_s is None else self.baseline_page_s + other.baseline_page_s
        return DecodingTotals(
            self.pages + other.pages, self.forwards + other.forwards, self.new_tokens + other.new_tokens,
            self.region_s + other.region_s, self.page_s + other.page_s, both,
        )

    @property
    def tau(self) -> float:
        return tau(self.new_tokens, self.forwards)

    @property
    def speedup(self) -> Speedup:
        """Plain page decoding (--baseline) against every VLM stage hsd ran for the same pages
        (region passes included: they are what buys the page's drafts). Without a baseline the
        speedup is unknown; tau bounds it from above."""
        if self.baseline_page_s is None:
            return Speedup(round(self.tau, 3), "estimate (tau; tree forwards cost more)")
        return Speedup(round(speedup(self.baseline_page_s, self.region_s + self.page_s), 3), "measured")

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
