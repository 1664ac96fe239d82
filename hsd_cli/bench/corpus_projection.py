"""What the throughput arms (`hsd bench throughput`) reach on a cost profile's device, at any rows:
the pages go through the decoding loop with an oracle of their output tokens in place of the model
(the same acceptance, step for step: bench/oracle.py) and every prefill and forward is priced on the
profile at its shape (rows, nodes per row, context). The outputs are a measured run's
(`hsd bench throughput --profile`) or a real model's published ones (`hsd bench acceptance
--profile`): then no model runs at all.

Every arm prefills the same pages at the same price, and speculation speeds up only the decoding:
where prefills take a share s of the plain engine's seconds, no verification can make hsd more than
1 / s times faster than it. Each arm's figures say so: its prefills' share of its seconds, and its
pages per second counting only the decoding (the ratio that speculation moves)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hsd_cli.bench.oracle import OracleState, OracleTarget
from hsd_cli.bench.page_stream import cycled
from hsd_cli.config import Sizing
from hsd_cli.decoding import DecodeConfig, DecodeRequest, NoDraftProposer, make_proposer
from hsd_cli.decoding.loop import decode_stream
from hsd_cli.decoding.sizing import LoadSizer, ReadSizers

if TYPE_CHECKING:
    from hsd_cli.profiles import Profile

ARMS = ("generate", "plain-cb", "hsd-1", "hsd-cb")


@dataclass(frozen=True)
class ProjectedRun:
    """Pages read, and their seconds on the profile: in all, and in prefills."""

    pages: int = 0
    seconds: float = 0.0
    prefill_s: float = 0.0

    def __add__(self, other: ProjectedRun) -> ProjectedRun:
        return ProjectedRun(self.pages + other.pages, self.seconds + other.seconds, self.prefill_s + other.prefill_s)


class CorpusPage(Protocol):
    id: str
    side: int  # the page picture's `square_side`, in pixels: what its prefill costs
    drafts: tuple[str, ...]



@dataclass
class PricedState(OracleState):
    prompt_tokens: list[int] = field(default_factory=list)  # per row


def _priced(state: OracleState, prompt_tokens: list[int]) -> PricedState:
    return PricedState(**{f.name: getattr(state, f.name) for f in fields(OracleState)}, prompt_tokens=prompt_tokens)


class PricedOracle(OracleTarget):
    """An oracle target that adds what each of its prefills and steps costs on `profile` (a step:
    its forward, the longer of the device's work and its eager issue, and the loop's host work
    around it); a plain engine on CUDA graphs (`on_graphs`) pays the device's work alone: a
    graph's replay issues nothing, and it schedules the next step while the device runs this one."""

    def __init__(self, tokenizer: Any, answers: dict[str, list[int]], stop_token_ids: Sequence[int], profile: Profile,
                 prompt_tokens: dict[str, int], sides: dict[str, int], on_graphs: bool = False) -> None:
        super().__init__(tokenizer, answers, stop_token_ids)
        self.profile, self.prompt_tokens, self.sides = profile, prompt_tokens, sides
        self.on_graphs = on_graphs
        self.seconds = 0.0
        self.prefill_s = 0.0  # of `seconds`

    def inputs(self, images: Sequence[Any], prompts: Sequence[str]) -> dict:
        return super().inputs(images, prompts) | {"prompts": list(prompts)}

    def prefill(self, inputs: dict) -> tuple[PricedState, torch.Tensor]:
        # Each joining row's prefill priced alone, as hsd and the plain engine prefill them apart.
        prefill_s = sum(self.profile.prefill_s(self.sides[prompt]) for prompt in inputs["prompts"])
        self.seconds += prefill_s
        self.prefill_s += prefill_s
        state, logits = super().prefill(inputs)
        return _priced(state, [self.prompt_tokens[prompt] for prompt in inputs["prompts"]]), logits

    def forward_tree(self, state: PricedState, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
        rows, width = tokens.shape
        context = round(sum(p + e for p, e in zip(state.prompt_tokens, state.emitted)) / rows)
        if self.on_graphs:
            self.seconds += self.profile.forward_s(rows, width, context)
        else:
            self.seconds += self.profile.step_s(rows, width, context)
        return super().forward_tree(state, tokens, depths, ancestors, valid)

    def keep_rows(self, state: PricedState, keep: Sequence[int]) -> None:
        super().keep_rows(state, keep)
        state.prompt_tokens = [state.prompt_tokens[i] for i in keep]

    def join(self, states: Sequence[PricedState]) -> PricedState:
        return _priced(super().join(states), [p for state in states for p in state.prompt_tokens])


def read_sizers(profile: Profile | None, pages: Sequence[CorpusPage], rows: int, sizing: Sizing = Sizing.PAGE,
                ) -> Callable[[int], LoadSizer] | None:
    """A sizer for each page read (by its index in `pages`), as `hsd convert --max-rows rows
    --sizing S` sizes each read (decoding.ReadSizers); None without a profile (whole trees)."""
    if profile is None:
        return None
    sizers = ReadSizers(profile.step_s, rows, shared=sizing is Sizing.BATCH)
    return lambda index: sizers.sizer(profile.prefill_tokens(pages[index].side))


def projected_seconds(
    pages: Sequence[CorpusPage], outputs: dict[str, list[int]], tokenizer: Any, stop_token_ids: Sequence[int],
    profile: Profile, match: str, config: DecodeConfig, *, rows: int, drafted: bool, sized: bool, on_graphs: bool,
    sizing: Sizing = Sizing.PAGE,
) -> ProjectedRun:
    """The pages read and their seconds on `profile` reading `pages` at `rows` (drafted or plainly), cycled to
    FILL (page_stream) times the rows where they are fewer; `sized`: verification sized for the load as `sizing`
    says (`read_sizers`), else whole trees."""
    sides = {page.id: page.side for page in pages}
    prompt_tokens = {page_id: profile.prefill_tokens(side) for page_id, side in sides.items()}
    oracle = PricedOracle(tokenizer, outputs, stop_token_ids, profile, prompt_tokens, sides, on_graphs)

    def request(page: CorpusPage) -> DecodeRequest:
        proposer = make_proposer(oracle, page.drafts, match) if drafted else NoDraftProposer()
        return DecodeRequest(None, page.id, proposer)

    stream = cycled(pages, rows)
    sizers = read_sizers(profile, stream, rows, sizing) if sized else None
    for _ in decode_stream(oracle, (request(page) for page in stream), config, max_rows=rows, sizers=sizers):
        pass
    return ProjectedRun(len(stream), oracle.seconds, oracle.prefill_s)


def memory_rows(profile: Profile, pages: Sequence[CorpusPage], outputs: dict[str, list[int]]) -> int | None:
    """The rows the profile's device holds beside the weights (serving.rows.device_rows), each row
    budgeted at the KV cache of a page's whole context (its prompt and its output), the mean over
    `pages`, and its fixed state (a hybrid's); None where the profile sets no memory (a CPU, a
    profile stored before)."""
    from hsd_cli.serving.rows import device_rows

    if profile.memory is None:
        return None
    context = sum(profile.prefill_tokens(page.side) + len(outputs[page.id]) for page in pages) / len(pages)
    memory = profile.memory
    return device_rows(memory.device_bytes, memory.weight_bytes, memory.row_bytes(context))


def feasible_rows(rows: Sequence[int], held: int | None) -> tuple[int, ...]:
    """The row counts the device's memory holds (one row always: a model that does not fit one is
    priced alone, as the plain engine would fail)."""
    return tuple(r for r in rows if held is None or r <= max(held, 1))


def plain_on_graphs(profile: Profile) -> bool:
    """Whether the projected plain engine replays CUDA graphs: on a GPU's (analytic) profile, as
    vLLM's does; a measured profile is this machine's, whose plain engine is hsd's own eager loop."""
    return profile.kind == "analytic"


def projected_arms(
    pages: Sequence[CorpusPage], outputs: dict[str, list[int]], tokenizer: Any, stop_token_ids: Sequence[int],
    profile: Profile, match: str, config: DecodeConfig, rows: Sequence[int], sizing: Sizing = Sizing.PAGE,
) -> dict[str, dict[int, ProjectedRun]]:
    """arm -> rows -> the projected run of `pages` (one kind), at the row counts the device's memory
    holds (`memory_rows`): more rows than fit are not priced. The plain engine runs on CUDA graphs
    (`plain_on_graphs`): on an analytic profile only (a measured one has its own launches)."""
    rows = feasible_rows(rows, memory_rows(profile, pages, outputs))

    def seconds(r: int, drafted: bool, on_graphs: bool = False) -> ProjectedRun:
        return projected_seconds(pages, outputs, tokenizer, stop_token_ids, profile, match, config,
                                 rows=r, drafted=drafted, sized=drafted, on_graphs=on_graphs, sizing=sizing)

    return {
        "generate": {1: seconds(1, False)},
        "plain-cb": {r: seconds(r, False, plain_on_graphs(profile)) for r in rows},
        "hsd-1": {1: seconds(1, True)},
        "hsd-cb": {r: seconds(r, True) for r in rows},
    }


def summed(runs: Sequence[dict[str, dict[int, ProjectedRun]]]) -> dict[str, dict[int, ProjectedRun]]:
    """The runs of several kinds one after the other: pages and seconds added, at the row counts
    every kind ran (each kind's memory may hold other rows)."""
    return {arm: {r: sum((run[arm][r] for run in runs), ProjectedRun()) for r in by if all(r in run[arm] for run in runs)}
            for arm, by in runs[0].items()}


def _rate(pages: int, seconds: float) -> float:
    return pages / seconds if seconds > 0 else 0.0


def projected_json(runs: dict[str, dict[int, ProjectedRun]]) -> dict[str, Any]:
    """Per arm at its best rows: pages per second, and the share of its seconds in prefills; at its
    best rows counting only the decoding: pages per decoding second. Pages per second per row count."""
    arms, by_rows = {}, {}
    for arm, by_count in runs.items():
        rates = {r: _rate(run.pages, run.seconds) for r, run in by_count.items()}
        decode_rates = {r: _rate(run.pages, run.seconds - run.prefill_s) for r, run in by_count.items()}
        best, decode_best = max(rates, key=rates.__getitem__), max(decode_rates, key=decode_rates.__getitem__)
        arms[arm] = {
            "best_rows": best, "pages_per_s": round(rates[best], 3),
            "prefill_share": round(by_count[best].prefill_s / by_count[best].seconds, 3) if by_count[best].seconds else 0.0,
            "decode_best_rows": decode_best, "decode_pages_per_s": round(decode_rates[decode_best], 3),
        }
        for r, rate in rates.items():
            by_rows.setdefault(str(r), {})[arm] = round(rate, 3)
    return {"arms": arms, "by_rows": dict(sorted(by_rows.items(), key=lambda item: int(item[0])))}
