"""`hsd eval`: score converted outputs against benchmark ground truth.

A leaf of the package: it reads the files `hsd convert` wrote (or another system's files in
olmOCR-Bench naming) and never imports the decoding core. stdout carries only the --json
object; people read the tables on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from hsd_cli.config import DraftBackendName, Stages
from hsd_cli.eval.errors import EvalEnvironmentError, EvalInputError, missing_dependency
from hsd_cli.eval.math_render import MathMode, MathRender, choose_math_mode

eval_app = typer.Typer(
    name="eval",
    help="Score outputs against olmOCR-Bench tests, OmniDocBench ground truth or ICDAR 2013 tables.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

USAGE_EXIT = 2
ENVIRONMENT_EXIT = 4  # as hsd convert's ExitCode.ENVIRONMENT: this machine cannot do the job

OutputsArg = Annotated[Path, typer.Argument(help="Output directory of hsd convert (or olmOCR-style *_pgN_repeatM.md).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON report object on stdout.")]
ConvertOpt = Annotated[bool, typer.Option("--convert", help="Convert --inputs into OUTDIR first, then score.")]
InputsOpt = Annotated[Path | None, typer.Option("--inputs", help="With --convert: the documents to convert.")]
StagesOpt = Annotated[Stages, typer.Option("--stages", help="With --convert: how much of the hierarchy runs.")]
DraftOpt = Annotated[DraftBackendName, typer.Option("--draft", help="With --convert: the draft backend.")]


def _run(scorer: Callable[[Console], dict[str, Any]], json_output: bool, show: Callable[[Console, dict], None]) -> None:
    """Shared shell of the commands: an error is one line and exit 2 or 4, never a traceback."""
    console = Console(stderr=True)
    try:
        report = scorer(console)
    except (EvalInputError, EvalEnvironmentError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(ENVIRONMENT_EXIT if isinstance(exc, EvalEnvironmentError) else USAGE_EXIT) from None
    show(console, report)
    if json_output:
        sys.stdout.write(json.dumps(report, ensure_ascii=False) + "\n")


def _maybe_convert(
    console: Console, convert: bool, inputs: Path | None, outputs: Path, stages: Stages, draft: DraftBackendName
) -> dict[str, Any] | None:
    """The --convert block of a report, or None; --inputs without --convert is a usage error."""
    if not convert:
        if inputs is not None:
            raise EvalInputError("--inputs is only used with --convert")
        return None
    if inputs is None:
        raise EvalInputError("--convert needs --inputs DIR")
    from hsd_cli.eval.convert import ConvertRequest, convert_inputs

    return convert_inputs(ConvertRequest(inputs, outputs, stages, draft), console)


@eval_app.command("olmocr-bench")
def olmocr_bench_command(
    outputs: OutputsArg,
    tests: Annotated[list[Path], typer.Option("--tests", help="olmOCR-Bench test file (.jsonl); repeatable.")],
    pdfs: Annotated[
        Path | None, typer.Option("--pdfs", help="The benchmark's pdfs/ folder: every PDF gets a baseline test.")
    ] = None,
    math_render: Annotated[
        MathRender,
        typer.Option("--math-render", help="Math tests: KaTeX in Chromium when found, or off; else they are unscored."),
    ] = MathRender.AUTO,
    require_math_render: Annotated[
        bool, typer.Option("--require-math-render", help="Fail (exit 4) rather than leave math tests unscored.")
    ] = False,
    baseline: Annotated[bool, typer.Option(help="Add olmOCR's baseline test for every PDF without one.")] = True,
    bootstrap_samples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples for the 95% interval.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
    convert: ConvertOpt = False,
    inputs: InputsOpt = None,
    stages: StagesOpt = Stages.AUTO,
    draft: DraftOpt = DraftBackendName.AUTO,
    json_output: JsonOpt = False,
) -> None:
    """Run olmOCR-Bench unit tests on each page's Markdown with olmocr's own scorer."""
    import hsd_cli.eval.olmocr_bench as bench
    from hsd_cli.eval.report import show_olmocr_bench

    def scorer(console: Console) -> dict[str, Any]:
        bench.import_bench()  # fail on a missing install or renderer before any conversion
        mode = _math_mode(console, math_render, require_math_render)
        conversion = _maybe_convert(console, convert, inputs, outputs, stages, draft)
        config = bench.BenchConfig(
            outputs=outputs,
            test_files=tuple(tests),
            pdfs=pdfs if pdfs is not None or not convert else inputs,
            baseline=baseline,
            bootstrap_samples=bootstrap_samples,
            seed=seed,
        )
        if not outputs.is_dir():
            raise EvalInputError(f"output directory not found: {outputs}")
        report = bench.score(config, mode)
        return report | {"convert": conversion}

    _run(scorer, json_output, show_olmocr_bench)


def _math_mode(console: Console, requested: MathRender, required: bool) -> MathMode:
    """The run's math mode; no renderer is an error under --require-math-render, else a warning."""
    if required and requested is MathRender.OFF:
        raise EvalInputError("--require-math-render contradicts --math-render off")
    mode = choose_math_mode(requested)
    if mode.katex:
        return mode
    if required:
        raise EvalEnvironmentError(f"--require-math-render: {mode.reason}")
    if requested is MathRender.AUTO:
        warning = f"[yellow]warning:[/yellow] math tests unscored: {escape(mode.reason)}"
        console.print(warning, highlight=False, soft_wrap=True)
    return mode


@eval_app.command("omnidocbench")
def omnidocbench_command(
    outputs: OutputsArg,
    gt: Annotated[Path, typer.Option("--gt", help="OmniDocBench ground truth JSON (a list of page records).")],
    convert: ConvertOpt = False,
    inputs: InputsOpt = None,
    stages: StagesOpt = Stages.AUTO,
    draft: DraftOpt = DraftBackendName.AUTO,
    json_output: JsonOpt = False,
) -> None:
    """Text edit distance, table TEDS and reading-order edit distance per page and overall."""
    from hsd_cli.eval.report import show_omnidocbench

    def scorer(console: Console) -> dict[str, Any]:
        try:
            from hsd_cli.eval.omnidocbench import score_pages
        except ImportError as exc:
            raise missing_dependency(exc, "OmniDocBench scoring") from None
        conversion = _maybe_convert(console, convert, inputs, outputs, stages, draft)
        return score_pages(outputs, gt) | {"convert": conversion}

    _run(scorer, json_output, show_omnidocbench)


@eval_app.command("tables")
def tables_command(
    outputs: OutputsArg,
    icdar: Annotated[Path, typer.Option("--icdar", help="Folder with ICDAR 2013 <doc>.pdf and <doc>-str.xml files.")],
    convert: ConvertOpt = False,
    inputs: InputsOpt = None,
    stages: StagesOpt = Stages.AUTO,
    draft: DraftOpt = DraftBackendName.AUTO,
    json_output: JsonOpt = False,
) -> None:
    """ICDAR 2013 cell-adjacency precision, recall and F1 of the tables in our Markdown."""
    from hsd_cli.eval.icdar import score_documents
    from hsd_cli.eval.report import show_tables

    def scorer(console: Console) -> dict[str, Any]:
        conversion = _maybe_convert(console, convert, inputs, outputs, stages, draft)
        return score_documents(outputs, icdar) | {"convert": conversion}

    _run(scorer, json_output, show_tables)
