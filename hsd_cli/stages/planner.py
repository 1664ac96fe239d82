"""The planner (`--stages auto` with a model and a cost profile): per page, the way of decoding it
that the profile predicts fastest, and per block whether a region pass pays. Every plan that reads
the page gives the same output (each is lossless): the plan changes only the seconds.

Plans: `plain` (transformers' generate, one forward per token: where drafts would not pay for the
wider forwards), `page` (the page stage verifying the pipeline's drafts), `region-page` (region
passes over some blocks' crops, batched, then the page stage verifying their outputs) and
`packed` (those region passes in the page stage's forwards: where extra rows are nearly free, as
on a GPU). `draft` where even the fastest would not finish within the page's time limit: the
draft stands in, as it would when the limit ended the reading, without the wait.

    seconds(plan) = prefill + region passes + page steps * step_s(rows, NODES_PER_STEP, context)
    page steps    = sum over blocks of n_b / tau_b      (plain: N steps of one node)
    region-page:  a block b in the region set R drafts the page at REGION_TAU instead of tau_b;
                  its crop costs a prefill and n_b / tau_b steps in batches of `region_batch` rows
    packed:       b in R drafts the page at tau_b * PACKED_GAIN (its output comes mid-page); its
                  row rides along in the page's forwards for its n_b / tau_b steps (at most
                  `packed_regions` rows beside the page's)

n_b: the block draft's tokens; tau_b: the acceptance of its draft (the page's prior by draft
source, moved towards the tau observed on the document's earlier pages, times the block kind's
measured factor). R is the blocks that save the most page steps, as many as the profile says pay.
OCR confidence is not used: on the same pages blocks above 0.95 draft alike in every band (tau
3.1 to 3.7, 83 blocks), and the two below 0.9 (tau 1.2) are too few to set a rule by.

Steps and prefills are priced by the profile (`Profile.step_s`, `Profile.prefill_s`), as the load
sizer and the benches' projections price them. A page read again because its model output says it
is rotated is not predicted: that is known only once the page has been read, and every plan would
read it again the same way (plain decoding plainly, the others with the page stage).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hsd_cli.config import Stages
from hsd_cli.records.page import Page, Plan, Way
from hsd_cli.profiles import Profile, square_side
from hsd_cli.records.kinds import Block, BlockKind
from hsd_cli.stages.dialect import draft_plan
from hsd_cli.stages.draft.pdf_text import PdfTextDraft

# Measured on this project's corpus (Qwen2 tokens, olmOCR outputs, `hsd bench pipeline`): the text
# layer drafts a page to tau 5.4 and OCR to 2.4 (OmniDocBench's OCR'd pages: 1.9); with every
# block's region output among the drafts, to 8.9 and 6.0 (region-page arm; OmniDocBench 2.65,
# where fewer of the output's tokens fall in a block's crop); packed, whose region outputs arrive
# mid-page, 1.2x.
TAU_PRIOR = {"born_digital": 4.5, "scan": 2.0}  # a little under the measured 5.4 and 2.4
REGION_TAU = {"born_digital": 8.0, "scan": 5.5}  # a little under the measured 8.9 and 6.0
PACKED_GAIN = 1.2
PRIOR_WEIGHT = 1.0  # the prior counts as this many observed pages
# Tree nodes a step verifies (chains up to 33; tries shrink while they fail): measured, weighted by
# tokens, by `hsd bench acceptance` (`nodes_per_step` of the page arm) on the same pages: 20.8 on
# text-layer drafts, 11.4 and 14.6 on OCR drafts (OmniDocBench, olmOCR-Bench scans).
NODES_PER_STEP = {"born_digital": 21, "scan": 12}
# The most a page's seconds were over-predicted (5.6x, docs/BENCHMARKS.md): a page predicted to
# take this many times its time limit would not finish within it, so its draft stands in at once
# rather than when the limit kills its worker.
PREDICTION_SLACK = 6.0
# A block kind's draft acceptance against all blocks of its draft source: `hsd bench acceptance`'s
# "blocks" on olmOCR-Bench's sample and OmniDocBench's demo pages (Qwen2 tokens; 117 text-layer
# blocks at tau 7.6, 129 OCR'd at 3.1), kinds with at least 2 blocks and 200 tokens; others 1.
# Text-layer tables draft well (HTML from the layer's cells), OCR'd ones poorly (no structure);
# headings are short, and a block's first token is never drafted.
KIND_FACTOR = {
    "born_digital": {"text": 0.95, "list": 0.87, "section_header": 0.44, "table": 1.43},
    "scan": {"text": 1.20, "list": 1.34, "section_header": 1.06, "table": 0.55},
}


def page_kind(draft_backend: str) -> str:
    """born_digital where the page was drafted from its text layer, scan where from OCR."""
    return "born_digital" if draft_backend == PdfTextDraft.name else "scan"


@dataclass(frozen=True)
class BlockOutlook:
    """What the planner knows of a block that drafts the page."""

    id: str
    kind: str
    tokens: int  # its draft's length in the model's tokens
    crop_side: int  # its crop's `square_side` in pixels; 0 where it gets no region pass (no crop, a figure)


def expected_tau(kind: str, earlier_tau: Sequence[float] = ()) -> float:
    """The prior of the page's kind, moved towards the tau of the document's earlier pages of it."""
    return (TAU_PRIOR[kind] * PRIOR_WEIGHT + sum(earlier_tau)) / (PRIOR_WEIGHT + len(earlier_tau))


@dataclass(frozen=True)
class _Costs:
    """The profile's prices for one page: of `kind`, drafted by `blocks`, its picture
    `picture_side` pixels a side (`square_side`), expected to draft at `tau`."""

    profile: Profile
    kind: str
    blocks: tuple[BlockOutlook, ...]
    picture_side: int
    tau: float
    region_batch: int

    @property
    def tokens(self) -> int:
        return max(1, sum(block.tokens for block in self.blocks))

    def block_tau(self, block: BlockOutlook) -> float:
        return max(1.0, self.tau * KIND_FACTOR[self.kind].get(block.kind, 1.0))

    def draft_steps(self, block: BlockOutlook) -> float:
        return block.tokens / self.block_tau(block)

    @property
    def nodes(self) -> int:
        return NODES_PER_STEP[self.kind]

    @property
    def page_prefill(self) -> float:
        return self.profile.prefill_s(self.picture_side)

    @property
    def page_context(self) -> int:
        return self.profile.prefill_tokens(self.picture_side) + self.tokens // 2

    def crop_prefills(self, regions: Sequence[BlockOutlook]) -> float:
        return sum(self.profile.prefill_s(block.crop_side) for block in regions)

    def page_steps(self, regions: Sequence[BlockOutlook], region_tau: float | None) -> float:
        """Page-stage steps with `regions`' outputs among the drafts (None: packed's gain)."""
        chosen = {block.id for block in regions}

        def steps(block: BlockOutlook) -> float:
            if block.id not in chosen:
                return self.draft_steps(block)
            return block.tokens / (region_tau or self.block_tau(block) * PACKED_GAIN)

        return max(1.0, sum(steps(block) for block in self.blocks))

    def plain(self) -> float:
        return self.page_prefill + self.tokens * self.profile.step_s(1, 1, self.page_context)

    def region_page(self, regions: Sequence[BlockOutlook]) -> float:
        region_s = self.crop_prefills(regions)
        for start in range(0, len(regions), self.region_batch):
            batch = regions[start : start + self.region_batch]
            context = max(self.profile.prefill_tokens(b.crop_side) + b.tokens // 2 for b in batch)
            region_s += max(self.draft_steps(b) for b in batch) * self.profile.step_s(len(batch), self.nodes, context)
        steps = self.page_steps(regions, REGION_TAU[self.kind])
        return self.page_prefill + region_s + steps * self.profile.step_s(1, self.nodes, self.page_context)

    def packed(self, regions: Sequence[BlockOutlook]) -> float:
        steps = self.page_steps(regions, None)
        # A region row leaves the batch when its block is read: the rows a page step carries, on average.
        rows = 1 + sum(min(self.draft_steps(block), steps) for block in regions) / steps
        return self.page_prefill + self.crop_prefills(regions) + steps * self.profile.step_s(rows, self.nodes, self.page_context)


def plan_page(
    profile: Profile, kind: str, blocks: tuple[BlockOutlook, ...], picture_side: int, *, region_batch: int,
    packed_regions: int, earlier_tau: Sequence[float] = (), time_limit_s: float = 0.0,
) -> Plan:
    """The way predicted fastest for a page of `kind` drafted by `blocks` (`picture_side`: its
    picture's `square_side` in pixels), with each way's best prediction: region passes go to the
    blocks whose outputs would save the most page steps, as many as the prediction says pay.
    `earlier_tau`: the page stage's tau on the document's earlier pages of this kind. `draft` where
    even the fastest would take far over `time_limit_s` (0: no limit). `region_batch` and
    `packed_regions` are the region and packed stages' row limits."""
    tau = expected_tau(kind, earlier_tau)
    costs = _Costs(profile, kind, blocks, picture_side, tau, region_batch)
    region_tau = REGION_TAU[kind]
    candidates = sorted(
        (block for block in blocks if block.crop_side and costs.block_tau(block) < region_tau),
        key=lambda block: block.tokens / costs.block_tau(block) - block.tokens / region_tau,
        reverse=True,
    )
    options: dict[Way, tuple[float, tuple[BlockOutlook, ...]]] = {
        Way.PLAIN: (costs.plain(), ()), Way.PAGE: (costs.region_page(()), ()),
    }
    for way, seconds, limit in ((Way.REGION_PAGE, costs.region_page, len(candidates)), (Way.PACKED, costs.packed, packed_regions)):
        prefixes = [tuple(candidates[:count]) for count in range(1, min(limit, len(candidates)) + 1)]
        if prefixes:
            options[way] = min(((seconds(regions), regions) for regions in prefixes), key=lambda option: option[0])
    chosen = min(options, key=lambda way: options[way][0])
    predicted = {way.value: seconds for way, (seconds, _) in options.items()}
    if time_limit_s and predicted[chosen] > PREDICTION_SLACK * time_limit_s:
        return Plan(Way.DRAFT, tau=tau, predicted_s=predicted)
    return Plan(chosen, regions=tuple(block.id for block in options[chosen][1]), tau=tau, predicted_s=predicted)


def picture_side(page: Page) -> int:
    """The `square_side` of the picture the model reads the page from: what its prefill is priced by."""
    return square_side(*page.model_view.size)


def crop_side(page: Page, block: Block, region_padding_px: int) -> int:
    """The `square_side` of the block's crop, 0 where it has none (too small)."""
    from hsd_cli.stages.rasterize import crop_box

    box = crop_box(page, block.bbox, region_padding_px)
    return square_side(box[2] - box[0], box[3] - box[1]) if box is not None else 0


def block_outlooks(page: Page, tokens: Callable[[str], int], region_padding_px: int) -> tuple[BlockOutlook, ...]:
    """The planner's view of the blocks that draft the page: each one's length in the model's
    tokens and the side of its crop."""
    return tuple(
        BlockOutlook(block.id, block.kind.value, tokens(block.text), crop_side(page, block, region_padding_px) if region else 0)
        for block, region in draft_plan(page.blocks, lambda block: True)
    )


def uncertain(block: Block) -> bool:
    """A block whose pipeline draft is uncertain: not from the text layer, or a table or formula
    (a born-digital text layer is already what the page stage would accept, docs/method.md section 7)."""
    return block.kind in (BlockKind.TABLE, BlockKind.FORMULA) or block.source != PdfTextDraft.name


def fixed_plan(stages: Stages, blocks: tuple[Block, ...], two_step: bool = False) -> Plan:
    """The plan --stages fixes: region passes over every block (region-page, packed), over none
    (page), or, for `auto` without a cost profile, over the uncertain blocks. A model whose makers
    read a page in two steps (`two_step`) reads it so whenever it reads it: its page prompt alone
    is not how they run it."""
    if two_step and stages is not Stages.DRAFT:
        return Plan(Way.BLOCKS)
    if stages is Stages.AUTO:
        return Plan(Way.REGION_PAGE, regions=tuple(block.id for block in blocks if uncertain(block)))
    way = Way(stages.value)
    return Plan(way, regions=tuple(block.id for block in blocks) if way in (Way.REGION_PAGE, Way.PACKED) else ())
