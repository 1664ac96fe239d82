"""`hsd bench pipeline`: hsd's VLM stages against transformers' generate on real pages, in one
process, with the same model, dtype and cache, per page kind.

Arms:
- `ar`: the page read with plain greedy `generate` (what a user of the model runs without hsd);
- `page`: the page stage alone, verifying the pipeline's drafts;
- `region-page`: a region pass on every block first, its outputs drafting the page stage;
- `packed`: the region passes and the page stage in the same forwards;
- `auto`: what `hsd convert --stages auto` does: with a cost profile (`--profile`, or the one
  `hsd profile` stored for the model), the planner's choice per page.
Every page is rendered and drafted once; each arm then reads it. A page is `born_digital` when
its draft came from the PDF's text layer, else `scan`.

Seconds: `decode_s` is all model work of an arm on the page (vision encoding, prefills and
decoding, region passes included); `e2e_s` adds rendering and drafting, which every arm shares.
With a profile, `projected` is the same work on the profile's device: every prefill at its
picture's size and every step at its measured shape (rows x nodes, context), rotation re-reads
included, priced by the profile as the planner prices them (`Profile.step_s`, `Profile.prefill_s`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hsd_cli.config import ConvertConfig, Stages
from hsd_cli.decoding.stats import speedup, tau
from hsd_cli.document.inputs import InputDocument, discover

if TYPE_CHECKING:
    from hsd_cli.decoding.stats import DecodeStats
    from hsd_cli.records.page import Page, Reading
    from hsd_cli.document.pipeline import DocumentSoFar
    from hsd_cli.profiles import Profile
    from hsd_cli.serving.model import VlmModel

ARMS = ("ar", "page", "region-page", "packed", "auto")
SPECULATIVE_ARMS = {"page": Stages.PAGE, "region-page": Stages.REGION_PAGE, "packed": Stages.PACKED, "auto": Stages.AUTO}
KINDS = ("born_digital", "scan")


@dataclass
class ArmTotals:
    """One arm's sums over the pages of one kind."""

    pages: int = 0
    forwards: int = 0
    new_tokens: int = 0
    decode_s: float = 0.0
    e2e_s: float = 0.0
    identical: int = 0  # pages whose tokens equal `ar`'s
    projected_s: float = 0.0  # the same work's seconds on the `--profile` device

    def add(self, reading: Reading, decode_s: float, e2e_s: float, identical: bool, projected_s: float) -> None:
        self.projected_s += projected_s
        self.pages += 1
        self.forwards += reading.forwards
        self.new_tokens += reading.result.stats.new_tokens
        self.decode_s += decode_s
        self.e2e_s += e2e_s
        self.identical += identical

    def as_json(self, ar: ArmTotals, profile: Profile | None) -> dict[str, Any]:
        projected = None
        if profile is not None:
            projected = {
                "profile": profile.name, "decode_s": round(self.projected_s, 3),
                "decode_speedup": round(speedup(ar.projected_s, self.projected_s), 3),
            }
        return {
            "pages": self.pages,
            "tau": round(tau(self.new_tokens, self.forwards), 3),
            "decode_s": round(self.decode_s, 3),
            "e2e_s": round(self.e2e_s, 3),
            "decode_speedup": round(speedup(ar.decode_s, self.decode_s), 3),
            "e2e_speedup": round(speedup(ar.e2e_s, self.e2e_s), 3),
            "identical_share": round(self.identical / self.pages, 4) if self.pages else 0.0,
            "projected": projected,
        }


def projected_s(profile: Profile, reading: Reading, picture_side: int, crop_sides: Mapping[str, int]) -> float:
    """What an arm's model work on the page costs on the profile's device, priced as the planner
    prices it: every prefill at its picture's size (`picture_side`: the page's `square_side`;
    `crop_sides`: each block's crop's), each step at its measured shape (rows x nodes, context),
    its host work included. Rows decoded together share their steps: a batch costs the steps of
    its longest-running row. A page read again because its output said it was rotated pays every
    read (a prefill of the turned page and the read's steps)."""
    from hsd_cli.stages.region import REGION_BATCH

    page_prompt = profile.prefill_tokens(picture_side)

    def steps_s(steps: list[tuple[int, int, int]], prompt: int) -> float:
        return sum(profile.step_s(rows, nodes, prompt + emitted) for rows, nodes, emitted in steps)

    def page_read_s(stats: DecodeStats) -> float:
        return profile.prefill_s(picture_side) + steps_s(stats.steps, page_prompt)

    first, *rereads = (*reading.earlier, reading.result.stats)
    rereads_s = sum(page_read_s(stats) for stats in rereads)
    regions = reading.regions
    crops_s = sum(profile.prefill_s(crop_sides[region.block_id]) for region in regions)
    if regions and not reading.region_s:  # packed: the region passes ran in the first read's forwards
        longest = max([first.steps, *(region.counts.steps for region in regions)], key=len)
        return profile.prefill_s(picture_side) + crops_s + steps_s(longest, page_prompt) + rereads_s
    batches = [regions[start : start + REGION_BATCH] for start in range(0, len(regions), REGION_BATCH)]
    region_s = sum(
        steps_s(max((region.counts.steps for region in batch), key=len),
                max(profile.prefill_tokens(crop_sides[region.block_id]) for region in batch))  # left-padded to the longest prompt
        for batch in batches
    )
    return crops_s + region_s + page_read_s(first) + rereads_s


def run_arm(arm: str, model: VlmModel, drafted: Page, so_far: DocumentSoFar) -> tuple[Page, float]:
    """The page planned and read as `arm` reads it (`ar`: plainly), and the seconds its model work took."""
    from hsd_cli.records.page import Plan, Way
    from hsd_cli.document.pipeline import plan_stage, read_stage

    started = perf_counter()
    plan = Plan(Way.PLAIN) if arm == "ar" else plan_stage(drafted, model, SPECULATIVE_ARMS[arm], so_far)
    planned = replace(drafted, plan=plan)
    read = replace(planned, reading=read_stage(planned, model, so_far))
    return read, perf_counter() - started


def bench_pages(
    model: VlmModel, documents: Sequence[InputDocument], arms: Sequence[str], config: ConvertConfig,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Every page of `documents` through every arm; totals per page kind and arm."""
    from hsd_cli.document.drafting import draft_stage
    from hsd_cli.document.pipeline import DocumentSoFar
    from hsd_cli.stages.draft import make_draft_backend
    from hsd_cli.stages.planner import crop_side, page_kind, picture_side
    from hsd_cli.stages.rasterize import DocumentError, open_document

    totals = {kind: {arm: ArmTotals() for arm in arms} for kind in KINDS}
    pages: list[dict[str, Any]] = []
    warmed = False
    for document in documents:
        path = document.path
        try:
            pdf, _ = open_document(path, document.kind, None)
        except DocumentError as exc:
            progress(f"{path}: skipped ({exc})")
            continue
        backend = make_draft_backend(config.document, path.stem)
        so_far = {arm: DocumentSoFar() for arm in arms}
        with pdf:
            for page in pdf:
                drafted = draft_stage(page, backend, config.document)
                if not warmed:  # lazy initialisation is not timed
                    model.target.generate_plainly(drafted.picture, model.settings.page_prompt, 1)
                    warmed = True
                kind = page_kind(drafted.backend)
                page_side = picture_side(drafted)
                crop_sides = {block.id: crop_side(drafted, block, model.settings.region_padding_px) for block in drafted.blocks}
                progress(f"{path.name} page {drafted.page_no} ({kind})")
                runs = {arm: run_arm(arm, model, drafted, so_far[arm]) for arm in arms}
                row: dict[str, Any] = {"input": str(path), "page": drafted.page_no, "kind": kind, "arms": {}}
                prepare_s = drafted.timings["render_s"] + drafted.timings["draft_s"]
                for arm, (read, decode_s) in runs.items():
                    reading = read.reading
                    identical = reading.result.tokens == runs["ar"][0].reading.result.tokens
                    projected = projected_s(model.profile, reading, page_side, crop_sides) if model.profile else 0.0
                    totals[kind][arm].add(reading, decode_s, prepare_s + decode_s, identical, projected)
                    page_tau = reading.result.stats.tau if read.plan.verifies_drafts else None
                    so_far[arm] = so_far[arm].then(kind, None if reading.result.loop else reading.text, page_tau)
                    row["arms"][arm] = {"forwards": reading.forwards, "new_tokens": reading.result.stats.new_tokens,
                                        "decode_s": round(decode_s, 3), "identical": identical}
                    if read.plan.predicted:
                        row["arms"][arm]["plan"] = read.plan.as_json()
                pages.append(row)
    kinds = {
        kind: {arm: arm_totals.as_json(by_arm["ar"], model.profile) for arm, arm_totals in by_arm.items()}
        for kind, by_arm in totals.items() if by_arm["ar"].pages
    }
    return {"kinds": kinds, "pages": pages}


def print_table(report: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    projected = bool(report.get("profile"))
    columns = ("kind", "arm", "pages", "tau", "decode s", "e2e s", "decode speedup", "e2e speedup", "identical")
    for column in columns + (("projected s", "projected speedup") if projected else ()):
        table.add_column(column, justify="left" if column in ("kind", "arm") else "right")
    for kind, arms in report["kinds"].items():
        for arm, row in arms.items():
            cells = [
                kind, arm, str(row["pages"]), f"{row['tau']:.2f}", f"{row['decode_s']:.1f}", f"{row['e2e_s']:.1f}",
                f"{row['decode_speedup']:.2f}x", f"{row['e2e_speedup']:.2f}x", f"{row['identical_share']:.0%}",
            ]
            if projected:
                cells += [f"{row['projected']['decode_s']:.2f}", f"{row['projected']['decode_speedup']:.2f}x"]
            table.add_row(*cells)
    Console(stderr=True).print(table)


def pipeline(
    paths: Annotated[list[str], typer.Argument(help="PDFs, images or directories of them.")],
    model: Annotated[str, typer.Option(help="Model id or local directory.")],
    device: Annotated[str | None, typer.Option(help="cpu, cuda or mps (default: what is present).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: as hsd convert).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model code from the model's repository.")] = False,
    arms: Annotated[str, typer.Option(help=f"Comma-separated arms among {', '.join(ARMS)} (ar always runs).")] = ",".join(ARMS),
    max_new_tokens: Annotated[int | None, typer.Option(help="Token budget per page (default: the family's).")] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="Cost profile (a stored name or a JSON file) the auto arm plans with and every arm's measured steps are projected onto (default: the one `hsd profile` stored for the model)."),
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Benchmark the VLM stages against transformers' generate on the same pages, per page kind."""
    chosen = ["ar"] + [arm for arm in dict.fromkeys(a.strip() for a in arms.split(",")) if arm and arm != "ar"]
    unknown = set(chosen) - set(ARMS)
    if unknown:
        raise typer.BadParameter(f"unknown arm(s) {', '.join(sorted(unknown))}; arms are {', '.join(ARMS)}", param_hint="--arms")
    found = discover(paths, recursive=True)
    documents = found.documents
    if not documents:
        raise typer.BadParameter("no PDF or image among the paths", param_hint="PATHS")
    import torch

    from hsd_cli.bench.loading import bench_model, bench_model_path
    # The draft settings of hsd convert's defaults.
    config = ConvertConfig(
        output_dir=Path("."), model=bench_model_path(model), device=device, dtype=dtype, trust_remote_code=trust_remote_code,
        max_new_tokens=max_new_tokens, profile=profile,
    )
    vlm = bench_model(config, threads)
    report = bench_pages(vlm, documents, chosen, config, progress=lambda line: print(line, file=sys.stderr))
    report.update(
        model=model, device=str(vlm.target.device), dtype=str(vlm.target.dtype).removeprefix("torch."),
        max_new_tokens=vlm.decode_config.max_new_tokens, threads=torch.get_num_threads(), arms=chosen,
        profile=vlm.profile.name if vlm.profile else None,
    )
    print_table(report, f"hsd bench pipeline: {model}, {report['dtype']}")
    if json_output:
        print(json.dumps(report))
