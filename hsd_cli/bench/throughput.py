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
How they are measured (interleaved repeats, medians, pages cycled, rows searched upward):
bench/throughput_runs.py. Drafting is outside every arm: its CPU seconds a page are reported, and
per arm the CPU cores that draft as fast as the arm reads (seconds a page x pages per second).
Without a profile the hsd arms verify whole trees (`sized` false). Pages of one kind are decoded
together; the whole corpus (`all`) is the kinds one after the other. Per row count, an arm's
`node_fill` is the share of its forwards' node slots that held a tree node: rows verify trees of
different widths and a forward is as wide as its widest, the rest padding.

With `--profile`, `projected` runs the same pages through the decoding loop again with an oracle of
the `generate` arm's tokens in place of the model (bench/oracle.py: the same acceptance, step by
step, at any rows) and prices every prefill and step on the profile (a step: its forward and the
loop's host work): pages per second on the profile's device up to `--projected-rows`. On an
analytic (GPU) profile the plain engine (`plain-cb`) is priced as a CUDA-graph engine: the device's
work of each forward alone, without the eager issue on the host hsd's steps pay where it outlasts
that work (`Profile.issue_s`), and no host work of its own (it schedules the next step while the
device runs this one).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import process_time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hsd_cli.bench.throughput_runs import (
    ArmRun, Measured, RowSearch, Runs, arm_run, median_summary, paired_ratio, searched_runs,
)
from hsd_cli.config import Sizing
from hsd_cli.document.inputs import InputDocument, discover

if TYPE_CHECKING:
    from PIL import Image

    from hsd_cli.bench.corpus_projection import ProjectedRun
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


def _rows_entry(runs: Runs, reference: ArmRun) -> dict[str, Any]:
    """Per row count every arm's medians, and hsd-cb over plain-cb repeat by repeat."""
    by_rows: dict[str, Any] = {}
    for arm, by_count in runs.items():
        for r, repeats in by_count.items():
            summary = median_summary(repeats, reference)
            by_rows.setdefault(str(r), {})[arm] = {key: summary[key] for key in ("pages_per_s", "spread", "tokens_per_s", "node_fill")}
    for r in runs.get("plain-cb", {}):
        by_rows[str(r)]["hsd-cb / plain-cb"] = paired_ratio(runs["hsd-cb"][r], runs["plain-cb"][r])
    return dict(sorted(by_rows.items(), key=lambda item: int(item[0])))


def summarised(runs: Runs, reference: ArmRun, draft_s: float) -> dict[str, Any]:
    """Per arm its best row count (by the median) and its figures there, with the CPU cores that
    draft as fast as it reads (drafting's CPU seconds a page x its pages per second); per row count
    every arm; the two batched arms' best against best."""
    arms = {}
    for arm, by_count in runs.items():
        summaries = {r: median_summary(repeats, reference) for r, repeats in by_count.items()}
        best = max(summaries, key=lambda r: summaries[r]["pages_per_s"])
        arms[arm] = {"best_rows": best, **summaries[best], "draft_cores": round(draft_s * summaries[best]["pages_per_s"], 3),
                     "identical_share": min(s["identical_share"] for s in summaries.values())}
    entry: dict[str, Any] = {"arms": arms, "by_rows": _rows_entry(runs, reference)}
    if "plain-cb" in arms and arms["plain-cb"]["pages_per_s"]:
        entry["best_against_best"] = round(arms["hsd-cb"]["pages_per_s"] / arms["plain-cb"]["pages_per_s"], 4)
    return entry


def whole_corpus(measured: dict[str, Runs], kinds: Sequence[str]) -> Runs:
    """The kinds one after the other, repeat by repeat, at the row counts every kind ran."""
    first = measured[kinds[0]]
    return {
        arm: {r: [sum((measured[k][arm][r][i] for k in kinds), ArmRun()) for i in range(len(repeats))]
              for r, repeats in by.items() if all(r in measured[k][arm] for k in kinds)}
        for arm, by in first.items()
    }


def row_counts(text: str, option: str, auto: bool = False) -> tuple[int, ...]:
    """Positive row counts separated by commas; with `auto`, "auto" is () (searched: RowSearch)."""
    if auto and text.strip() == "auto":
        return ()
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        also = " or auto" if auto else ""
        raise typer.BadParameter(f"give positive row counts separated by commas{also}, not {text!r}", param_hint=option)
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class BenchPlan:
    """How the measured arms run: the row counts (given or searched), repeats, tree sizing."""

    search: RowSearch
    repeats: int = 3
    sizing: Sizing = Sizing.PAGE


def _draft_s(pages: Sequence[CorpusPage]) -> float:
    return sum(page.draft_cpu_s for page in pages) / len(pages)


def _with_projection(entry: dict[str, Any], runs: dict[str, dict[int, ProjectedRun]], draft_s: float,
                     rows_held: int | None) -> None:
    from hsd_cli.bench.corpus_projection import projected_json

    projection = projected_json(runs)
    entry["projected_rows_held"] = rows_held  # more rows than the device's memory holds are not priced
    for arm, figures in projection["arms"].items():
        entry["arms"][arm]["projected"] = figures | {"draft_cores": round(draft_s * figures["pages_per_s"], 3)}
    entry["projected_by_rows"] = projection["by_rows"]


def corpus_report(model: VlmModel, pages: Sequence[CorpusPage], plan: BenchPlan, projected_rows: Sequence[int],
                  progress: Any) -> dict[str, Any]:
    from hsd_cli.bench.corpus_projection import memory_rows, projected_arms, summed

    kinds = [kind for kind in KINDS if any(page.kind == kind for page in pages)]
    of_kind = {kind: [page for page in pages if page.kind == kind] for kind in kinds}
    measured: dict[str, Measured] = {}
    projected: dict[str, dict[str, dict[int, ProjectedRun]]] = {}
    outputs: dict[str, list[int]] = {}
    model.target.generate_plainly(pages[0].picture, model.settings.page_prompt, 1)  # lazy initialisation, untimed
    for kind in kinds:
        progress(f"{kind}: {len(of_kind[kind])} pages")
        measured[kind] = searched_runs(lambda arm, r: arm_run(model, of_kind[kind], arm, r, plan.sizing), plan.search,
                                       plan.repeats, progress)
        if model.profile is not None:
            outputs |= measured[kind].runs["generate"][1][0].tokens
            projected[kind] = projected_arms(
                of_kind[kind], outputs, model.target.tokenizer, model.target.stop_token_ids, model.profile,
                model.settings.draft_match, model.decode_config, projected_rows, plan.sizing,
            )
    runs = {kind: measured[kind].runs for kind in kinds} | {"all": whole_corpus({k: measured[k].runs for k in kinds}, kinds)}
    if projected:
        projected["all"] = summed([projected[k] for k in kinds])
    draft_s = {kind: _draft_s(of_kind[kind]) for kind in kinds} | {"all": _draft_s(pages)}
    report: dict[str, Any] = {"kinds": {}}
    for kind in [*kinds, "all"]:
        entry = summarised(runs[kind], runs[kind]["generate"][1][0], draft_s[kind])
        entry["draft_cpu_s_per_page"] = round(draft_s[kind], 4)
        entry["rows_stopped"] = measured[kind].stopped if kind in measured else None
        if kind in projected:
            chosen = pages if kind == "all" else of_kind[kind]
            _with_projection(entry, projected[kind], draft_s[kind], memory_rows(model.profile, chosen, outputs))
        report["kinds"][kind] = entry
    report["draft_cpu_s_per_page"] = round(draft_s["all"], 4)
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"pages per second (best rows; medians of {report['repeats']} repeats)")
    for column in ("kind", "arm", "best rows", "pages/s", "spread", "tokens/s", "latency s", "identical", "draft cores",
                   "projected rows", "projected pages/s", "projected prefill share"):
        table.add_column(column, justify="left" if column in ("kind", "arm") else "right")
    for kind, entry in report["kinds"].items():
        for arm, row in entry["arms"].items():
            projected = row.get("projected") or {}
            table.add_row(kind, arm, str(row["best_rows"]), f"{row['pages_per_s']:.3f}", f"{row['spread']:.0%}",
                          f"{row['tokens_per_s']:.1f}", f"{row['mean_latency_s']:.2f}", f"{row['identical_share']:.0%}",
                          f"{row['draft_cores']:.2f}", str(projected.get("best_rows", "-")),
                          f"{projected['pages_per_s']:.2f}" if projected else "-",
                          f"{projected['prefill_share']:.0%}" if projected else "-")
    Console(stderr=True).print(table)


def bench_report(config: Any, paths: Sequence[str], plan: BenchPlan, projected_rows: Sequence[int], threads: int | None,
                 progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The bench over the documents under `paths` with the model `config` names; None when no page
    could be read. Also what `hsd device-check` runs."""
    import torch

    from hsd_cli.bench.corpus_projection import plain_on_graphs
    from hsd_cli.bench.loading import bench_model

    vlm = bench_model(config, threads)
    pages = corpus_pages(discover(paths, recursive=True).documents, vlm, progress)
    if not pages:
        return None
    report = corpus_report(vlm, pages, plan, projected_rows, progress)
    report.update(
        sizing=plan.sizing.value, repeats=plan.repeats, rows_given=list(plan.search.given) or "auto",
        model=config.model, device=str(vlm.target.device), dtype=str(vlm.target.dtype).removeprefix("torch."),
        threads=torch.get_num_threads(), pages=len(pages), max_new_tokens=vlm.decode_config.max_new_tokens,
        sized=vlm.profile is not None, profile=vlm.profile.name if vlm.profile else None,
        profile_kind=vlm.profile.kind if vlm.profile else None,
        plain_on_graphs=bool(vlm.profile) and plain_on_graphs(vlm.profile), issue_s=vlm.profile.issue_s if vlm.profile else 0.0,
    )
    return report


def throughput(
    paths: Annotated[list[str], typer.Argument(help="PDFs, images or directories of them.")],
    model: Annotated[str, typer.Option(help="Model id or local directory.")],
    rows: Annotated[str, typer.Option(help="Row counts the batched arms run at, comma-separated; auto: from 1, doubling, until plain-cb gains less than --min-gain (or memory runs out).")] = "auto",
    repeats: Annotated[int, typer.Option(min=1, help="Rounds of the arms, interleaved; every figure is the median over them.")] = 3,
    max_rows: Annotated[int, typer.Option(min=1, help="With --rows auto: the most rows tried.")] = 256,
    min_gain: Annotated[float, typer.Option(min=0.0, help="With --rows auto: the plain engine's gain over the row count before (a share) below which the rows stop rising.")] = 0.05,
    profile: Annotated[
        str | None,
        typer.Option(help="Cost profile (a stored name or a JSON file): the hsd arms size verification with it, and every arm is projected onto its device (default: the one `hsd profile` stored for the model)."),
    ] = None,
    projected_rows: Annotated[str, typer.Option(help="Row counts projected on the profile's device.")] = ",".join(map(str, PROJECTED_ROWS)),
    sizing: Annotated[Sizing, typer.Option(help="How the hsd-cb arm sizes its trees, as `hsd convert --sizing`: per page, or for the whole batch.")] = Sizing.PAGE,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: as hsd convert).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model code from the model's repository.")] = False,
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per page (default: the family's).")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Pages per second over a corpus: hsd (one page at a time, and continuously batched with
    verification sized by the load) against generate and the plain continuous-batching engine; the
    arms interleaved over --repeats, medians and spreads; drafting's CPU seconds a page and the
    cores that keep each arm fed."""
    counts, projected_counts = row_counts(rows, "--rows", auto=True), row_counts(projected_rows, "--projected-rows")
    if not discover(paths, recursive=True).documents:
        raise typer.BadParameter("no PDF or image among the paths", param_hint="PATHS")
    from pathlib import Path

    from hsd_cli.bench.loading import bench_model_path
    from hsd_cli.config import ConvertConfig

    config = ConvertConfig(output_dir=Path("."), model=bench_model_path(model), device=device, dtype=dtype,
                           trust_remote_code=trust_remote_code, max_new_tokens=max_new_tokens, profile=profile)
    plan = BenchPlan(RowSearch(counts, max_rows, min_gain), repeats, sizing)
    report = bench_report(config, paths, plan, projected_counts, threads, lambda line: print(line, file=sys.stderr))
    if report is None:
        print("error: no page could be read", file=sys.stderr)
        raise typer.Exit(1)
    report["model"] = model
    if json_output:
        print(json.dumps(report, indent=1))
    else:
        print_table(report)
