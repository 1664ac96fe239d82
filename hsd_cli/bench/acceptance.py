"""`hsd bench acceptance`: the forwards a real model's lossless greedy decoding takes on hsd's
drafts, computed exactly from that model's published outputs and its tokenizer (`oracle.py`),
on pages drafted as `hsd convert` drafts them. Heavy imports wait for the command to run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hsd_cli.config import Sizing

if TYPE_CHECKING:
    import pymupdf

    from hsd_cli.bench.oracle import BenchPage
    from hsd_cli.models.family_settings import ModelSettings
    from hsd_cli.recipes.recipe import Recipe

# The draft backend that drafted a page says what kind of page it is.
PAGE_KINDS = {"pdf-text": "born-digital", "ocr": "scan"}


def bench_recipe(named: str | None, settings: ModelSettings) -> Recipe:
    """The recipe whose model pictures the bench prices: the one named (of the family's), else the
    family's default (hsd's own render)."""
    from hsd_cli.recipes.registry import family_default, recipes

    if named is None:
        return family_default(settings)
    recipe = recipes().get(named)
    if recipe is None:
        raise typer.BadParameter(f"no recipe {named!r}; `hsd models --recipes` lists them", param_hint="--recipe")
    if recipe.family != settings.family:
        raise typer.BadParameter(f"recipe {named!r} is for {recipe.family} models, not {settings.family}", param_hint="--recipe")
    return recipe


def picture_side(page: pymupdf.Page, size_pt: tuple[float, float], recipe: Recipe) -> int:
    """The `square_side` of the picture the model reads of the page, what its prefill is priced
    by: hsd's render of `size_pt` points under the family's default, else the recipe's rule."""
    from hsd_cli.profiles import square_side
    from hsd_cli.recipes.registry import is_family_default
    from hsd_cli.stages.rasterize import model_picture_size, render_scale

    if is_family_default(recipe):
        scale = render_scale(size_pt, recipe.render.dpi, recipe.render.max_pixels)
        return square_side(*(round(points * scale) for points in size_pt))
    return square_side(*model_picture_size(page, recipe.render))


def draft_bench_pages(outputs: Path, inputs: Path, settings: ModelSettings, recipe: Recipe, log) -> list[BenchPage]:
    """Every page with a published output, drafted as `hsd convert` drafts it (default settings)
    and written in the family's dialect as the page stage writes its drafts: settled, as in a
    convert run, by the outputs of the document's earlier pages. Each page's picture is the one
    `recipe` has the model read (`picture_side`)."""
    from hsd_cli.bench.oracle import BenchBlock, BenchPage
    from hsd_cli.config import ConvertConfig
    from hsd_cli.document.inputs import sniff_kind
    from hsd_cli.replay.dataset import pair_pages, region_target
    from hsd_cli.stages.draft import draft_page, make_draft_backend
    from hsd_cli.stages.dialect import block_drafts, draft_plan, page_drafts, settled
    from hsd_cli.stages.rasterize import open_document

    pairs, unmatched = pair_pages(outputs, inputs)
    for name in unmatched:
        log(f"warning: {name}: no document for this output in {inputs}; left out")
    defaults = ConvertConfig(output_dir=outputs)
    pages = []
    earlier: dict[Path, list[str]] = {}  # per document, its pages' outputs so far (pairs come in page order)
    for pair in pairs:
        output = pair.output.read_text(encoding="utf-8").strip()
        document, _ = open_document(pair.document, sniff_kind(pair.document), None)
        with document:
            pdf_page = document[pair.page_no - 1]
            draft = draft_page(make_draft_backend(defaults.document, pair.document.stem), pdf_page)
            side = picture_side(pdf_page, draft.size_pt, recipe)
        outputs_so_far = earlier.setdefault(pair.document, [])
        dialect = settled(settings, outputs_so_far)
        drafts = tuple(page_drafts(draft.blocks, dialect, page_size=draft.size_pt))  # as --stages page drafts
        blocks = tuple(
            BenchBlock(block.source, block.kind.value, block.confidence, tuple(block_drafts(block, dialect)), span)
            for block, region in draft_plan(draft.blocks, lambda block: True)
            if region and (span := region_target(block.text, output)[0])
        )
        if output:
            outputs_so_far.append(output)
        page_id = f"{pair.document.relative_to(inputs)}:{pair.page_no}"
        pages.append(BenchPage(page_id, PAGE_KINDS.get(draft.backend, draft.backend), output, drafts, blocks, side))
        log(f"{page_id}: {draft.backend} draft, {len(drafts)} blocks, {len(output)} output chars")
    return pages


def projected_throughput(
    pages: list[BenchPage], tokenizer: Any, stop_token_id: int, match: str, config: Any, profile_name: str,
    rows: tuple[int, ...], sizing: Sizing,
) -> dict[str, Any]:
    """Per page kind and over all pages (the kinds one after the other): each throughput arm's
    projected pages per second on the profile's device, with the published outputs as the model's."""
    from hsd_cli.bench.corpus_projection import memory_rows, plain_on_graphs, projected_arms, projected_json, summed
    from hsd_cli.profiles import load_profile

    try:
        profile = load_profile(profile_name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"cannot read cost profile {profile_name!r}: {exc}", param_hint="--profile") from None
    outputs = {page.id: tokenizer.encode(page.output, add_special_tokens=False) + [stop_token_id] for page in pages}
    of_kind = {kind.replace("-", "_"): [page for page in pages if page.kind == kind] for kind in sorted({page.kind for page in pages})}
    by_kind = {
        kind: projected_arms(chosen, outputs, tokenizer, [stop_token_id], profile, match, config, rows, sizing)
        for kind, chosen in of_kind.items()
    }
    # Rows above what the device's memory holds at the pages' contexts are not priced.
    kinds = {kind: projected_json(runs) | {"rows_held": memory_rows(profile, of_kind[kind], outputs)} for kind, runs in by_kind.items()}
    kinds["all"] = projected_json(summed(list(by_kind.values()))) | {"rows_held": memory_rows(profile, pages, outputs)}
    return {"profile": profile.name, "profile_kind": profile.kind, "sizing": sizing.value,
            "plain_on_graphs": plain_on_graphs(profile), "issue_s": profile.issue_s, "kinds": kinds}


def print_table(report: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("arm", "pages", "tokens", "forwards", "tau", *(f"tau {kind}" for kind in sorted(
        {kind for arm in report["arms"].values() for kind in arm["kinds"]}
    ))):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for name, arm in report["arms"].items():
        kinds = [f"{k['tau']:.2f} ({k['pages']})" for _, k in sorted(arm["kinds"].items())]
        table.add_row(name, str(arm["pages"]), str(arm["tokens"]), str(arm["forwards"]), f"{arm['tau']:.2f}", *kinds)
    blocks = Table(title="blocks' drafts against their part of the output (a region pass's acceptance)")
    for column in ("draft source / block kind", "blocks", "tokens", "forwards", "tau"):
        blocks.add_column(column, justify="left" if column.startswith("draft") else "right")
    for group, row in report["blocks"].items():
        blocks.add_row(group, str(row["blocks"]), str(row["tokens"]), str(row["forwards"]), f"{row['tau']:.2f}")
    console = Console(stderr=True)
    console.print(table)
    console.print(blocks)


def acceptance(
    outputs: Annotated[Path, typer.Option(help="A real model's published outputs (Markdown, named as for replay-model build).")],
    inputs: Annotated[Path, typer.Option(help="The documents those outputs were made from.")],
    tokenizer: Annotated[str, typer.Option(help="That model's tokenizer: a local directory or a hub id in the HF cache.")],
    family: Annotated[str, typer.Option(help="Model family whose settings (draft matching, token budget) apply.")] = "qwen2_5_vl",
    end_token: Annotated[
        str | None, typer.Option(help="The token that ends the model's answer (default: the tokenizer's eos token).")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="A cost profile (stored name or JSON file): also project corpus throughput on its device, per arm of `hsd bench throughput`, from these outputs."),
    ] = None,
    rows: Annotated[str, typer.Option(help="Row counts to project, comma-separated (with --profile).")] = "1,2,4,8,16,32,64,128,256,448",
    sizing: Annotated[Sizing, typer.Option(help="How the projected hsd-cb arm sizes its trees, as `hsd convert --sizing`: per page, or for the whole batch.")] = Sizing.PAGE,
    recipe: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="Price each page's prefill at the picture this recipe renders and decode to its budget, as `hsd convert --recipe` reads (default: the family's default, hsd's 150-dpi render)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Acceptance in a real model's tokens: forwards and tau of lossless greedy decoding on hsd's
    drafts, computed exactly from published outputs (no model runs); with --profile, the corpus
    throughput those outputs give on the profile's device."""
    from transformers import AutoTokenizer

    from hsd_cli.bench.oracle import run_acceptance
    from hsd_cli.bench.throughput import row_counts
    from hsd_cli.decoding import DecodeConfig
    from hsd_cli.models.family_settings import settings_for
    from hsd_cli.settings_files import SettingsFileError

    for option, path in (("--outputs", outputs), ("--inputs", inputs)):
        if not path.is_dir():
            raise typer.BadParameter(f"{path} is not a directory", param_hint=option)
    try:
        settings = settings_for(family)
        loaded = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError, SettingsFileError) as exc:
        print(f"error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        raise typer.Exit(2) from None
    end = end_token or loaded.eos_token
    stop_token_id = loaded.convert_tokens_to_ids(end) if end else None
    if stop_token_id is None or stop_token_id == loaded.unk_token_id:
        raise typer.BadParameter(f"{end!r} is not a token of {tokenizer}", param_hint="--end-token")
    read_by = bench_recipe(recipe, settings)
    if profile is not None:
        row_counts(rows, "--rows")  # a bad --rows fails before any page is drafted
    pages = draft_bench_pages(outputs, inputs, settings, read_by, log=lambda message: print(message, file=sys.stderr))
    if not pages:
        print(f"error: no output in {outputs} belongs to a document in {inputs}", file=sys.stderr)
        raise typer.Exit(2)
    config = DecodeConfig(max_new_tokens=read_by.decoding.max_new_tokens)
    report = run_acceptance(pages, loaded, stop_token_id, settings.draft_match, config)
    if profile is not None:
        report["throughput"] = projected_throughput(pages, loaded, stop_token_id, settings.draft_match, config, profile,
                                                    row_counts(rows, "--rows"), sizing)
    report.update(
        outputs=str(outputs), inputs=str(inputs), tokenizer=tokenizer, family=settings.family,
        family_match=settings.draft_match, end_token=end, max_new_tokens=config.max_new_tokens,
    )
    if recipe is not None:  # the default's report stays as it was before recipes
        report["recipe"] = read_by.name
    print_table(report, f"hsd bench acceptance: {outputs.name}, {len(pages)} pages, {tokenizer}")
    if json_output:
        print(json.dumps(report, ensure_ascii=False))
