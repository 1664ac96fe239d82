"""`hsd bench throughput`: pages per second over a corpus, hsd against the plain engine a corpus
user runs, per page kind.

Arms (every page rendered and drafted once; each arm reads every page's whole picture with the
page prompt):
- `generate`: transformers' own generate, one page at a time (what a user of the model runs alone);
- `plain-cb`: continuous batching without drafts (the plain engine: rows join and leave between
  forwards, as vLLM schedules them), at each `--rows`;
- `hsd-1`: one page at a time, verifying the pipeline's drafts (hsd convert's page stage);
- `hsd-cb`: continuous batching verifying the drafts, each step's trees cut to the width the cost
  profile prices best (decoding/sizing.py), at each `--rows`.
Without a profile the hsd arms verify whole trees (`sized` false). Pages of one kind are decoded
together; the whole corpus (`all`) is the kinds one after the other. Per row count, an arm's
`node_fill` is the share of its forwards' node slots that held a tree node: rows verify trees of
different widths and a forward is as wide as its widest, the rest padding.

With `--profile`, `projected` runs the same pages through the decoding loop again with an oracle of
the `generate` arm's tokens in place of the model (bench/oracle.py: the same acceptance, step by
step, at any rows) and prices every prefill and step on the profile (a step: its forward and the
loop's host work): pages per second on the profile's device up to `--projected-rows`. On an
analytic (GPU) profile the plain engine (`plain-cb`) is priced as a CUDA-graph engine:
`--graph-saving-ms` less per forward than the eager 4 ms the profile includes, and no host work of
its own (it schedules the next step while the device runs this one).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from time import perf_counter, process_time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hsd_cli.config import Sizing
from hsd_cli.document.inputs import InputDocument, discover

if TYPE_CHECKING:
    from PIL import Image

    from hsd_cli.bench.corpus_projection import ProjectedRun
    from hsd_cli.decoding import DecodeRequest, DecodeResult
    from hsd_cli.decoding.sizing import LoadSizer
    from hsd_cli.serving.model import VlmModel

KINDS = ("born_digital", "scan")
PROJECTED_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 448)


@dataclass(frozen=True)
class CorpusPage:
    id: str  # the document's path and the page number
    kind: str  # born_digital or scan
    picture: Image.Image
    drafts: tuple[str, ...]  # the page stage's drafts
    draft_cpu_s: float  # CPU seconds of rendering and drafting the page

    @property
    def side(self) -> int:
        from hsd_cli.profiles import square_side

        return square_side(*self.picture.size)


@dataclass
class ArmRun:
    """One arm's run over the pages of one kind at one row count."""

    seconds: float = 0.0
    tokens: dict[str, list[int]] = field(default_factory=dict)  # by page id
    latencies: list[float] = field(default_factory=list)  # admitted to finished, per page
    # Over every page's tree steps: the nodes verified (roots included), and the node slots of
    # those steps' forwards (a row is padded to the widest tree of its forward). None for `generate`.
    nodes: int = 0
    slots: int = 0

    def add(self, page_id: str, result: DecodeResult, latency: float) -> None:
        self.tokens[page_id] = result.tokens
        self.latencies.append(latency)
        self.nodes += result.stats.proposed + len(result.stats.steps)
        self.slots += sum(width for _, width, _ in result.stats.steps)

    def summary(self, reference: ArmRun | None) -> dict[str, Any]:
        pages = len(self.tokens)
        new_tokens = sum(len(tokens) for tokens in self.tokens.values())
        identical = sum(tokens == reference.tokens[page] for page, tokens in self.tokens.items()) if reference else pages
        return {
            "pages_per_s": round(pages / self.seconds, 4) if self.seconds else 0.0,
            "tokens_per_s": round(new_tokens / self.seconds, 2) if self.seconds else 0.0,
            "mean_latency_s": round(sum(self.latencies) / pages, 3) if pages else 0.0,
            "identical_share": round(identical / pages, 4) if pages else 0.0,
            "node_fill": round(self.nodes / self.slots, 4) if self.slots else None,
        }

    def __add__(self, other: ArmRun) -> ArmRun:
        return ArmRun(self.seconds + other.seconds, self.tokens | other.tokens, self.latencies + other.latencies,
                      self.nodes + other.nodes, self.slots + other.slots)


def corpus_pages(documents: Sequence[InputDocument], model: VlmModel, progress: Any) -> list[CorpusPage]:
    """Every page rendered and drafted as `hsd convert` does by default, with its CPU seconds."""
    from pathlib import Path

    from hsd_cli.config import ConvertConfig
    from hsd_cli.document.drafting import draft_stage
    from hsd_cli.stages.dialect import page_drafts
    from hsd_cli.stages.draft import make_draft_backend
    from hsd_cli.stages.planner import page_kind
    from hsd_cli.stages.rasterize import DocumentError, open_document

    config = ConvertConfig(output_dir=Path("."), model=model.config.model)
    pages = []
    for document in documents:
        try:
            pdf, _ = open_document(document.path, document.kind, None)
        except DocumentError as exc:
            progress(f"{document.path}: skipped ({exc})")
            continue
        backend = make_draft_backend(config.document, document.path.stem)
        with pdf:
            for pdf_page in pdf:
                started = process_time()
                page = draft_stage(pdf_page, backend, config.document)
                drafts = tuple(page_drafts(page.blocks, model.settings))
                pages.append(CorpusPage(f"{document.path}#{page.page_no}", page_kind(page.backend), page.picture, drafts,
                                        process_time() - started))
    return pages


def page_requests(model: VlmModel, pages: Sequence[CorpusPage], drafted: bool) -> list[DecodeRequest]:
    from hsd_cli.decoding import DecodeRequest, NoDraftProposer, make_proposer

    prompt, match = model.settings.page_prompt, model.settings.draft_match
    return [
        DecodeRequest(page.picture, prompt, make_proposer(model.target, page.drafts, match) if drafted else NoDraftProposer())
        for page in pages
    ]


def streamed(target: Any, pages: Sequence[CorpusPage], requests: Sequence[DecodeRequest], rows: int, config: Any,
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


def generated(model: VlmModel, pages: Sequence[CorpusPage]) -> ArmRun:
    run = ArmRun()
    config = model.decode_config
    for page in pages:
        started = perf_counter()
        run.tokens[page.id] = model.target.generate_plainly(page.picture, model.settings.page_prompt, config.max_new_tokens)
        run.latencies.append(perf_counter() - started)
    run.seconds = sum(run.latencies)
    return run


def measured_runs(model: VlmModel, pages: Sequence[CorpusPage], rows: Sequence[int], sizing: Sizing) -> dict[str, dict[int, ArmRun]]:
    """arm -> rows -> run, over `pages` (one kind). Generate and hsd-1 run at one row; hsd-cb sizes
    its trees as `hsd convert --sizing` does."""
    from hsd_cli.bench.corpus_projection import read_sizers

    config = model.decode_config
    runs: dict[str, dict[int, ArmRun]] = {"generate": {1: generated(model, pages)}}
    runs["hsd-1"] = {1: ArmRun()}
    for page, request in zip(pages, page_requests(model, pages, drafted=True)):
        runs["hsd-1"][1] += streamed(model.target, [page], [request], 1, config, read_sizers(model.profile, [page], 1))
    runs["plain-cb"] = {r: streamed(model.target, pages, page_requests(model, pages, False), r, config, None) for r in rows}
    runs["hsd-cb"] = {
        r: streamed(model.target, pages, page_requests(model, pages, True), r, config, read_sizers(model.profile, pages, r, sizing))
        for r in rows
    }
    return runs


def summarised(runs: dict[str, dict[int, ArmRun]], reference: ArmRun) -> dict[str, Any]:
    """The issue's shape: per arm its best row count and figures there; per row count every arm."""
    arms, by_rows = {}, {}
    for arm, by_count in runs.items():
        summaries = {r: run.summary(reference) for r, run in by_count.items()}
        best = max(summaries, key=lambda r: summaries[r]["pages_per_s"])
        arms[arm] = {"best_rows": best, **summaries[best],
                     "identical_share": min(s["identical_share"] for s in summaries.values())}
        for r, summary in summaries.items():
            by_rows.setdefault(str(r), {})[arm] = {key: summary[key] for key in ("pages_per_s", "tokens_per_s", "node_fill")}
    return {"arms": arms, "by_rows": dict(sorted(by_rows.items(), key=lambda item: int(item[0])))}


def row_counts(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise typer.BadParameter(f"give positive row counts separated by commas, not {text!r}", param_hint=option)
    return tuple(sorted(set(values)))


def corpus_report(model: VlmModel, pages: Sequence[CorpusPage], rows: Sequence[int], projected_rows: Sequence[int],
                  graph_saving_s: float, progress: Any, sizing: Sizing = Sizing.PAGE) -> dict[str, Any]:
    from hsd_cli.bench.corpus_projection import projected_arms, projected_json, summed

    kinds = [kind for kind in KINDS if any(page.kind == kind for page in pages)]
    measured: dict[str, dict[str, dict[int, ArmRun]]] = {}
    projected: dict[str, dict[str, dict[int, ProjectedRun]]] = {}
    model.target.generate_plainly(pages[0].picture, model.settings.page_prompt, 1)  # lazy initialisation, untimed
    for kind in kinds:
        of_kind = [page for page in pages if page.kind == kind]
        progress(f"{kind}: {len(of_kind)} pages, rows {', '.join(map(str, rows))}")
        measured[kind] = measured_runs(model, of_kind, rows, sizing)
        if model.profile is not None:
            outputs = measured[kind]["generate"][1].tokens
            projected[kind] = projected_arms(
                of_kind, outputs, model.target.tokenizer, model.target.stop_token_ids, model.profile,
                model.settings.draft_match, model.decode_config, projected_rows, graph_saving_s, sizing,
            )
    # The whole corpus: the kinds one after the other.
    measured["all"] = {arm: {r: sum((measured[k][arm][r] for k in kinds), ArmRun()) for r in by} for arm, by in measured[kinds[0]].items()}
    if projected:
        projected["all"] = summed([projected[k] for k in kinds])
    report: dict[str, Any] = {"kinds": {}}
    for kind in [*kinds, "all"]:
        entry = summarised(measured[kind], measured[kind]["generate"][1])
        if kind in projected:
            projection = projected_json(projected[kind])
            for arm, figures in projection["arms"].items():
                entry["arms"][arm]["projected"] = figures
            entry["projected_by_rows"] = projection["by_rows"]
        report["kinds"][kind] = entry
    draft_s = sum(page.draft_cpu_s for page in pages) / len(pages)
    best = report["kinds"]["all"]["arms"]["hsd-cb"]
    report["draft_cpu_s_per_page"] = round(draft_s, 4)
    # Cores that draft as fast as the model reads: CPU seconds per page x pages per second.
    report["draft_cores_per_device"] = {
        "measured": round(draft_s * best["pages_per_s"], 3),
        "projected": round(draft_s * best["projected"]["pages_per_s"], 3) if "projected" in best else None,
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="pages per second (best rows)")
    for column in ("kind", "arm", "best rows", "pages/s", "tokens/s", "latency s", "identical", "projected rows", "projected pages/s",
                   "projected prefill share"):
        table.add_column(column, justify="left" if column in ("kind", "arm") else "right")
    for kind, entry in report["kinds"].items():
        for arm, row in entry["arms"].items():
            projected = row.get("projected") or {}
            table.add_row(kind, arm, str(row["best_rows"]), f"{row['pages_per_s']:.3f}", f"{row['tokens_per_s']:.1f}",
                          f"{row['mean_latency_s']:.2f}", f"{row['identical_share']:.0%}", str(projected.get("best_rows", "-")),
                          f"{projected['pages_per_s']:.2f}" if projected else "-",
                          f"{projected['prefill_share']:.0%}" if projected else "-")
    Console(stderr=True).print(table)


def throughput(
    paths: Annotated[list[str], typer.Argument(help="PDFs, images or directories of them.")],
    model: Annotated[str, typer.Option(help="Model id or local directory.")],
    rows: Annotated[str, typer.Option(help="Row counts the batched arms run at, comma-separated.")] = "1,4,8,16,32",
    profile: Annotated[
        str | None,
        typer.Option(help="Cost profile (a stored name or a JSON file): the hsd arms size verification with it, and every arm is projected onto its device (default: the one `hsd profile` stored for the model)."),
    ] = None,
    projected_rows: Annotated[str, typer.Option(help="Row counts projected on the profile's device.")] = ",".join(map(str, PROJECTED_ROWS)),
    graph_saving_ms: Annotated[float, typer.Option(help="Per-forward launch time a CUDA-graph plain engine saves against hsd's eager 4 ms (analytic profiles).")] = 3.0,
    sizing: Annotated[Sizing, typer.Option(help="How the hsd-cb arm sizes its trees, as `hsd convert --sizing`: per page, or for the whole batch.")] = Sizing.PAGE,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: as hsd convert).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model code from the model's repository.")] = False,
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per page (default: the family's).")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Pages per second over a corpus: hsd (one page at a time, and continuously batched with
    verification sized by the load) against generate and the plain continuous-batching engine."""
    counts, projected_counts = row_counts(rows, "--rows"), row_counts(projected_rows, "--projected-rows")
    documents = discover(paths, recursive=True).documents
    if not documents:
        raise typer.BadParameter("no PDF or image among the paths", param_hint="PATHS")
    import torch

    from hsd_cli.bench.loading import bench_model, bench_model_path
    from pathlib import Path

    from hsd_cli.config import ConvertConfig

    config = ConvertConfig(output_dir=Path("."), model=bench_model_path(model), device=device, dtype=dtype,
                           trust_remote_code=trust_remote_code, max_new_tokens=max_new_tokens, profile=profile)
    vlm = bench_model(config, threads)

    def progress(line: str) -> None:
        print(line, file=sys.stderr)

    pages = corpus_pages(documents, vlm, progress)
    if not pages:
        print("error: no page could be read", file=sys.stderr)
        raise typer.Exit(1)
    report = corpus_report(vlm, pages, counts, projected_counts, graph_saving_ms / 1000, progress, sizing)
    report.update(
        sizing=sizing.value,
        model=model, device=str(vlm.target.device), dtype=str(vlm.target.dtype).removeprefix("torch."),
        threads=torch.get_num_threads(), pages=len(pages), max_new_tokens=vlm.decode_config.max_new_tokens,
        sized=vlm.profile is not None, profile=vlm.profile.name if vlm.profile else None,
        profile_kind=vlm.profile.kind if vlm.profile else None,
        plain_graph_saving_s=graph_saving_ms / 1000 if vlm.profile and vlm.profile.kind == "analytic" else 0.0,
    )
    if json_output:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
