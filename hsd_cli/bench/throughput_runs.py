"""The measured side of `hsd bench throughput`, made fair to every arm on a machine that drifts:

- the arms run interleaved, repeat after repeat (each repeat rotates their order), and every figure
  is the median over the repeats with its spread: a machine whose `generate` drifted 32 % between
  two whole runs moves every arm of a repeat alike;
- a batched arm streams the pages cycled until FILL times its rows are read, so that it runs at a
  steady state rather than a small corpus's tail of ever fewer rows;
- the row counts (`RowSearch`) rise from one, doubling, until the plain engine stops gaining or the
  device's memory runs out: "best rows" is the plain engine's own best, not the best of two tried.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

from hsd_cli.bench.page_stream import FILL, cycled
from hsd_cli.config import Sizing

if TYPE_CHECKING:
    from hsd_cli.decoding import DecodeRequest, DecodeResult
    from hsd_cli.decoding.sizing import LoadSizer
    from hsd_cli.serving.model import VlmModel

ONE_ROW_ARMS = ("generate", "hsd-1")
BATCHED_ARMS = ("plain-cb", "hsd-cb")


@dataclass
class ArmRun:
    """One arm's run over the pages of one kind at one row count (one repeat)."""

    seconds: float = 0.0
    tokens: dict[str, list[int]] = field(default_factory=dict)  # by page id
    latencies: list[float] = field(default_factory=list)  # admitted to finished, per page read
    unstable: set[str] = field(default_factory=set)  # pages whose reads (cycled) differed
    new_tokens: int = 0  # over every read
    # Over every page's tree steps: the nodes verified (roots included), and the node slots of
    # those steps' forwards (a row is padded to the widest tree of its forward). None for `generate`.
    nodes: int = 0
    slots: int = 0

    def add_tokens(self, page_id: str, tokens: list[int], latency: float) -> None:
        if page_id in self.tokens and self.tokens[page_id] != tokens:
            self.unstable.add(page_id)
        self.tokens[page_id] = tokens
        self.latencies.append(latency)
        self.new_tokens += len(tokens)

    def add(self, page_id: str, result: DecodeResult, latency: float) -> None:
        self.add_tokens(page_id, result.tokens, latency)
        self.nodes += result.stats.proposed + len(result.stats.steps)
        self.slots += sum(width for _, width, _ in result.stats.steps)

    @property
    def pages_per_s(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def summary(self, reference: ArmRun | None) -> dict[str, Any]:
        reads, pages = len(self.latencies), len(self.tokens)
        identical = sum(
            page not in self.unstable and (reference is None or tokens == reference.tokens[page])
            for page, tokens in self.tokens.items()
        )
        return {
            "pages_read": reads,
            "pages_per_s": round(self.pages_per_s, 4),
            "tokens_per_s": round(self.new_tokens / self.seconds, 2) if self.seconds else 0.0,
            "mean_latency_s": round(sum(self.latencies) / reads, 3) if reads else 0.0,
            "identical_share": round(identical / pages, 4) if pages else 0.0,
            "node_fill": round(self.nodes / self.slots, 4) if self.slots else None,
        }

    def __add__(self, other: ArmRun) -> ArmRun:
        return ArmRun(self.seconds + other.seconds, self.tokens | other.tokens, self.latencies + other.latencies,
                      self.unstable | other.unstable, self.new_tokens + other.new_tokens, self.nodes + other.nodes,
                      self.slots + other.slots)


def page_requests(model: VlmModel, pages: Sequence[Any], drafted: bool) -> list[DecodeRequest]:
    from hsd_cli.decoding import DecodeRequest, NoDraftProposer, make_proposer

    prompt, match = model.settings.page_prompt, model.settings.draft_match
    return [
        DecodeRequest(page.picture, prompt, make_proposer(model.target, page.drafts, match) if drafted else NoDraftProposer())
        for page in pages
    ]


def streamed(target: Any, pages: Sequence[Any], requests: Sequence[DecodeRequest], rows: int, config: Any,
             sizers: Callable[[int], LoadSizer] | None) -> ArmRun:
    """The pages through `decode_stream` at `rows`, timed; a page's latency runs from its admission.
    `sizers`: each page's sizer, by its index (None: whole trees)."""
    from hsd_cli.decoding.loop import decode_stream

    admitted: dict[int, float] = {}

    def feed() -> Iterator[DecodeRequest]:
        for index, request in enumerate(requests):
            admitted[index] = perf_counter()
            yield request

    run = ArmRun()
    started = perf_counter()
    for index, result in decode_stream(target, feed(), config, max_rows=rows, separate_prefill=True, sizers=sizers):
        run.add(pages[index].id, result, perf_counter() - admitted[index])
    run.seconds = perf_counter() - started
    return run


def generated(model: VlmModel, pages: Sequence[Any]) -> ArmRun:
    run = ArmRun()
    for page in pages:
        started = perf_counter()
        tokens = model.target.generate_plainly(page.picture, model.settings.page_prompt, model.decode_config.max_new_tokens)
        run.add_tokens(page.id, tokens, perf_counter() - started)
    run.seconds = sum(run.latencies)
    return run


def arm_run(model: VlmModel, pages: Sequence[Any], arm: str, rows: int, sizing: Sizing) -> ArmRun:
    """One run of `arm` over `pages` (one kind) at `rows`; hsd-cb sizes its trees as `hsd convert
    --sizing` does, hsd-1 sizes each page alone."""
    from hsd_cli.bench.corpus_projection import read_sizers

    config = model.decode_config
    if arm == "generate":
        return generated(model, pages)
    if arm == "hsd-1":
        run = ArmRun()
        for page, request in zip(pages, page_requests(model, pages, drafted=True)):
            run += streamed(model.target, [page], [request], 1, config, read_sizers(model.profile, [page], 1))
        return run
    stream = cycled(pages, rows)
    drafted = arm == "hsd-cb"
    sizers = read_sizers(model.profile, stream, rows, sizing) if drafted else None
    return streamed(model.target, stream, page_requests(model, stream, drafted), rows, config, sizers)


Runs = dict[str, dict[int, list[ArmRun]]]  # arm -> rows -> one run per repeat


def interleaved(run_arm: Callable[[str, int], ArmRun], rows: int, repeats: int, runs: Runs) -> None:
    """`repeats` rounds of the arms at `rows` (the one-row arms too at one row), each round's order
    rotated by one, appended to `runs`. `generate` leads the first round: its tokens are the reference."""
    arms = [*(ONE_ROW_ARMS if rows == 1 else ()), *BATCHED_ARMS]
    for repeat in range(repeats):
        order = arms[repeat % len(arms):] + arms[:repeat % len(arms)]
        for arm in order:
            runs.setdefault(arm, {}).setdefault(rows, []).append(run_arm(arm, rows))


def out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(exc).lower()


@dataclass(frozen=True)
class RowSearch:
    """Row counts: the given ones, or (`given` empty) from one, doubling, until the plain engine's
    median pages per second gains less than `min_gain` over the count before, up to `max_rows`."""

    given: tuple[int, ...] = ()
    max_rows: int = 256
    min_gain: float = 0.05

    def counts(self) -> Iterator[int]:
        if self.given:
            yield from self.given
            return
        rows = 1
        while rows <= self.max_rows:
            yield rows
            rows *= 2

    def gaining(self, runs: Runs, rows: int) -> bool:
        if self.given:
            return True
        counts = sorted(runs.get("plain-cb", {}))
        if len(counts) < 2 or counts[-1] != rows:
            return True
        before, now = (median_rate(runs["plain-cb"][r]) for r in counts[-2:])
        return now > before * (1 + self.min_gain)


def median_rate(runs: Sequence[ArmRun]) -> float:
    return statistics.median(run.pages_per_s for run in runs)


@dataclass(frozen=True)
class Measured:
    runs: Runs
    stopped: str  # why the row counts stopped rising


def searched_runs(run_arm: Callable[[str, int], ArmRun], search: RowSearch, repeats: int, progress: Any) -> Measured:
    """Every arm at each row count `search` gives, interleaved over `repeats`; stops rising where the
    plain engine stops gaining or a run runs out of memory (that count's runs are dropped)."""
    runs: Runs = {}
    for rows in search.counts():
        progress(f"  {rows} rows, {repeats} repeats")
        trial: Runs = {}
        try:
            interleaved(run_arm, rows, repeats, trial)
        except Exception as exc:  # noqa: BLE001 - only the device's memory running out ends the search
            if not out_of_memory(exc):
                raise
            return Measured(runs, f"out of memory at {rows} rows")
        for arm, by_rows in trial.items():
            runs.setdefault(arm, {}).update(by_rows)
        if not search.gaining(runs, rows):
            return Measured(runs, f"plain-cb gained less than {search.min_gain:.0%} from {rows // 2} to {rows} rows")
    return Measured(runs, "the row counts given" if search.given else f"reached {search.max_rows} rows")


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far the repeats of one figure lie apart."""
    middle = statistics.median(values)
    return round((max(values) - min(values)) / middle, 4) if middle else 0.0


def median_summary(runs: Sequence[ArmRun], reference: ArmRun) -> dict[str, Any]:
    """The repeats' summaries as one: each figure's median, the pages per second of every repeat and
    their spread, and the lowest identical share."""
    summaries = [run.summary(reference) for run in runs]
    merged = {key: statistics.median(s[key] for s in summaries) if summaries[0][key] is not None else None
              for key in ("pages_read", "pages_per_s", "tokens_per_s", "mean_latency_s", "node_fill")}
    rates = [s["pages_per_s"] for s in summaries]
    return {**merged, "pages_per_s_repeats": rates, "spread": spread(rates),
            "identical_share": min(s["identical_share"] for s in summaries)}


def paired_ratio(numerator: Sequence[ArmRun], denominator: Sequence[ArmRun]) -> dict[str, Any]:
    """Median and spread of one arm's pages per second over another's, repeat by repeat (the two ran
    side by side in each repeat, so the machine's drift cancels)."""
    ratios = [a.pages_per_s / b.pages_per_s for a, b in zip(numerator, denominator) if b.pages_per_s]
    return {"median": round(statistics.median(ratios), 4), "spread": spread(ratios)} if ratios else {}
