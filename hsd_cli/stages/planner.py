"""The planner (`--stages auto` with a model and a cost profile): per page, the way of decoding it
that the profile predicts fastest. Every plan gives the same output (each is lossless): the plan
changes only the seconds.

Plans: `plain` (transformers' generate, one forward per token: where drafts would not pay for the
wider forwards), `page` (the page stage verifying the pipeline's drafts) and `packed` (region
passes in the page stage's forwards: where extra rows are nearly free, as on a GPU).

    seconds(plan) = prefill + steps * forward_s(rows, nodes, context)
    plain:  steps = N,                 rows 1,          nodes 1
    page:   steps = N / tau,           rows 1,          nodes WIDTH
    packed: steps = N / (tau * GAIN),  rows 1 + k / 2,  nodes WIDTH   (+ k crop prefills)

N: tokens expected (the drafts' length), k: the crops, tau: the page's expected acceptance (a
prior by draft source, moved towards the tau observed on the document's earlier pages).
Measured on this project's corpus, the text layer drafts a page to tau 5.4 and OCR to 2.4 (Qwen2
tokens, olmOCR outputs); region outputs drafting the page raise it by about a fifth (packed
arm, `hsd bench pipeline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hsd_cli.config import Stages
from hsd_cli.profiles import Profile
from hsd_cli.records import Block, PageImage
from hsd_cli.stages.dialect import draft_plan
from hsd_cli.stages.draft.pdf_text import PdfTextDraft
from hsd_cli.stats import PagePlan

if TYPE_CHECKING:
    from hsd_cli.stages.vlm import VlmModel

TAU_PRIOR = {"born_digital": 4.5, "scan": 2.0}  # a little under the measured 5.4 and 2.4
PRIOR_WEIGHT = 1.0  # the prior counts as this many observed pages
WIDTH = 24  # tree nodes a step verifies, typically (chains up to 33, tries shrink while they fail)
PACKED_GAIN = 1.2  # tau with region outputs among the page's drafts, against without


def page_kind(draft_backend: str) -> str:
    """born_digital where the page was drafted from its text layer, scan where from OCR."""
    return "born_digital" if draft_backend == PdfTextDraft.name else "scan"


@dataclass(frozen=True)
class PageOutlook:
    """What the planner knows of a page before decoding it."""

    kind: str  # "born_digital" (drafted from the text layer) or "scan" (from OCR)
    expected_tokens: int
    crops: int  # blocks a packed pass would read
    picture_side: int  # the page picture's longer side, in pixels
    earlier_tau: tuple[float, ...] = ()  # the page stage's tau on the document's earlier pages of this kind


def expected_tau(outlook: PageOutlook) -> float:
    prior = TAU_PRIOR[outlook.kind]
    seen = outlook.earlier_tau
    return (prior * PRIOR_WEIGHT + sum(seen)) / (PRIOR_WEIGHT + len(seen))


def plan_page(profile: Profile, outlook: PageOutlook) -> PagePlan:
    tau = expected_tau(outlook)
    tokens = max(1, outlook.expected_tokens)
    page_prefill, crop_prefill = profile.prefill_s(outlook.picture_side), profile.prefill_s(0)
    context = profile.prefill_tokens(outlook.picture_side) + tokens // 2
    predicted = {
        "plain": page_prefill + tokens * profile.forward_s(1, 1, context),
        "page": page_prefill + tokens / tau * profile.forward_s(1, WIDTH, context),
    }
    if outlook.crops:
        rows = 1 + outlook.crops / 2  # region rows end early and leave the batch
        steps = tokens / (tau * PACKED_GAIN)
        predicted["packed"] = page_prefill + outlook.crops * crop_prefill + steps * profile.forward_s(rows, WIDTH, context)
    return PagePlan(chosen=min(predicted, key=predicted.get), tau=tau, predicted_s=predicted)


def page_outlook(
    model: VlmModel, image: PageImage, blocks: tuple[Block, ...], kind: str, earlier_tau: Sequence[tuple[str, float]]
) -> PageOutlook:
    """The planner's view of a page: the drafts' length in the model's tokens, the crops a packed
    pass would read, the picture's size, and the tau of the document's earlier pages of its kind."""
    from hsd_cli.stages.packed import PACKED_REGIONS
    from hsd_cli.stages.region import region_planner

    text = "\n\n".join(block.text for block, _ in draft_plan(blocks, lambda block: False))
    crops = sum(region for _, region in draft_plan(blocks, region_planner(Stages.PACKED)))
    return PageOutlook(
        kind=kind,
        expected_tokens=len(model.target.encode(text)) if text else 0,
        crops=min(crops, PACKED_REGIONS),
        picture_side=max(image.image.size),
        earlier_tau=tuple(tau for seen_kind, tau in earlier_tau if seen_kind == kind),
    )
