"""Command line: parses options into frozen config and hands over; holds no conversion logic.

Every option of `convert` has an HSD_<NAME> environment variable and a key in the `[convert]`
table of a TOML config file; see hsd_cli/user_settings.py for the precedence.
"""

from __future__ import annotations

import functools
import json as json_lib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hsd_cli import __version__
from hsd_cli.bench import bench_app
from hsd_cli.bench.device_check import device_check
from hsd_cli.eval import eval_app
from hsd_cli.profiles.command import profile as profile_command
from hsd_cli.recipes.command import models
from hsd_cli.replay import replay_app
from hsd_cli.config import ConvertConfig, DraftBackendName, Executor, ImageMode, RunConfig, Sizing, Stages, UsageError
from hsd_cli.user_settings import describe_sources, load_config_callback

app = typer.Typer(
    name="hsd",
    help="Convert PDFs and page images to Markdown + JSON (draft pipeline, VLM with speculative decoding).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect hsd's configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(bench_app, name="bench")
app.add_typer(eval_app, name="eval")
app.add_typer(replay_app, name="replay-model")
app.command("models")(models)
app.command("device-check")(device_check)


@app.command("profile")
@functools.wraps(profile_command)
def profile(**options: Any) -> None:
    """`hsd profile`, which also takes a replay model's name (`--model olmocr-replay-qwen2`: its
    build in the user cache, or exit 4 with the command that builds it), as `hsd convert` does."""
    if options["model"] is not None:
        from hsd_cli.bench.loading import bench_model_path

        options["model"] = bench_model_path(options["model"])
    profile_command(**options)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hsd {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """hsd: hierarchical speculative decoding for document parsing."""


def _env(name: str) -> str:
    return f"HSD_{name.upper()}"


def _model_directory_problem(model: str) -> str | None:
    """Why `--model` names no usable local directory, when it is one or looks like a path (absolute,
    starting with '.' or '~', or more separators than a hub id's `namespace/name`); else None."""
    path = Path(model)
    separators = sum(model.count(sep) for sep in (os.sep, os.altsep) if sep)
    if path.is_dir():
        return None if (path / "config.json").is_file() else f"cannot load model {model!r}: directory has no config.json"
    if path.is_absolute() or model.startswith((".", "~")) or separators > 1:
        return f"cannot load model {model!r}: {'not a directory' if path.exists() else 'no such directory'}"
    return None


@app.command()
def convert(
    inputs: Annotated[
        list[str] | None, typer.Argument(help="PDF or image files, directories or glob patterns.", show_default=False)
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", envvar=_env("output"), help="Output directory (mirrors the input tree).")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            is_eager=True, callback=load_config_callback, help="TOML config file (\\[convert] table; below env and flags)."
        ),
    ] = None,
    files_from: Annotated[
        str | None,
        typer.Option(envvar=_env("files_from"), help="Read input paths (literal, no globs) from FILE, or stdin with '-'."),
    ] = None,
    null: Annotated[
        bool, typer.Option("--null", "-0", envvar=_env("null"), help="--files-from entries are NUL-separated.")
    ] = False,
    recursive: Annotated[
        bool,
        typer.Option("--recursive/--no-recursive", envvar=_env("recursive"), help="Descend into subdirectories."),
    ] = True,
    pages: Annotated[str | None, typer.Option(envvar=_env("pages"), help="Pages, 1-based, e.g. 1-3,7 or 5-.")] = None,
    dpi: Annotated[int, typer.Option(envvar=_env("dpi"), help="Rendering resolution for page images and OCR.")] = 150,
    max_pixels: Annotated[
        int, typer.Option(envvar=_env("max_pixels"), help="Cap on pixels per rendered page (dpi is lowered to fit).")
    ] = 4_194_304,
    draft: Annotated[
        DraftBackendName,
        typer.Option(envvar=_env("draft"), help="Draft backend; auto = legible text layer, OCR for the rest, per page; ocr = OCR every page."),
    ] = DraftBackendName.AUTO,
    draft_json: Annotated[
        Path | None,
        typer.Option(envvar=_env("draft_json"), help="With --draft paddleocr: read PP-StructureV3 result JSON here."),
    ] = None,
    images: Annotated[
        ImageMode, typer.Option(envvar=_env("images"), help="Figures: saved and referenced, or left out.")
    ] = ImageMode.REF,
    page_markers: Annotated[
        bool, typer.Option(envvar=_env("page_markers"), help="Insert <!-- page N --> before each page.")
    ] = False,
    password: Annotated[str | None, typer.Option(envvar=_env("password"), help="Password for encrypted PDFs.")] = None,
    stages: Annotated[Stages, typer.Option(envvar=_env("stages"), help="How much of the hierarchy runs.")] = Stages.AUTO,
    model: Annotated[
        str | None, typer.Option(envvar=_env("model"), help="VLM id or local directory; without it only the draft runs.")
    ] = None,
    device: Annotated[
        str | None, typer.Option(envvar=_env("device"), help="cpu, cuda, cuda:N or mps (default: the best present).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(envvar=_env("dtype"), help="float32, bfloat16 or float16 (default: bfloat16 on GPUs and bf16-capable CPUs, else float32; float16 on MPS).")
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option(envvar=_env("trust_remote_code"), help="Allow model code from the model's repository.")
    ] = False,
    max_new_tokens: Annotated[
        int | None, typer.Option(envvar=_env("max_new_tokens"), help="Token budget per page (default: per family).")
    ] = None,
    baseline: Annotated[
        bool, typer.Option(envvar=_env("baseline"), help="Also decode each page plainly with transformers' generate, to measure the speedup against it.")
    ] = False,
    near_lossless: Annotated[
        float | None,
        typer.Option(
            metavar="TAU", envvar=_env("near_lossless"),
            help="Near-lossless decoding (off by default): also accept a draft token whose probability is at least TAU (0 < TAU <= 1) times the model's top token's, never inside math; the output may then differ from plain decoding's, and each page says so.",
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", envvar=_env("recipe"),
            help="Read pages as the model's makers do: the recipe NAME (`hsd models --recipes` lists them; default: the makers' recipe of a known model id, else the family's default).",
        ),
    ] = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", envvar=_env("greedy"), help="Decode greedily where the recipe's makers sample (olmOCR samples at temperature 0.1).")
    ] = False,
    seed: Annotated[
        int, typer.Option(envvar=_env("seed"), help="Seed of the sampling where the recipe samples: a seed gives the same text with or without speculation.")
    ] = 0,
    profile: Annotated[
        str | None,
        typer.Option(envvar=_env("profile"), help="Cost profile (a name `hsd profile` stored, or a JSON file) that --stages auto plans each page with (default: the stored profile of this model, device and dtype, if there is one; else a fixed rule)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(envvar=_env("overwrite"), help="Convert again even what the manifest says is done.")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option(envvar=_env("retry_failed"), help="Convert again documents that failed before.")
    ] = False,
    shard: Annotated[
        str | None, typer.Option(envvar=_env("shard"), help="Take shard I of N of the inputs, e.g. 2/4.")
    ] = None,
    page_timeout: Annotated[
        float, typer.Option(envvar=_env("page_timeout"), help="Seconds a page may take (0 = no limit).")
    ] = 600.0,
    doc_timeout: Annotated[
        float, typer.Option(envvar=_env("doc_timeout"), help="Seconds a document may take (0 = no limit).")
    ] = 0.0,
    max_page_error_rate: Annotated[
        float, typer.Option(envvar=_env("max_page_error_rate"), help="Share of failed pages above which a document fails.")
    ] = 0.2,
    max_docs_per_worker: Annotated[
        int, typer.Option(envvar=_env("max_docs_per_worker"), help="Replace the worker process after this many documents per row in flight (--max-rows).")
    ] = 50,
    max_rows: Annotated[
        int | None, typer.Option(envvar=_env("max_rows"), help="Rows the model keeps in flight: with a model, this many documents share one worker (a process, or each Ray actor) and the model's forwards (default: as many as the GPU's memory holds; 1 on the CPU and on Ray).")
    ] = None,
    sizing: Annotated[
        Sizing,
        typer.Option(envvar=_env("sizing"), help="With --max-rows above 1 and a cost profile: size each step's trees per page (a page's counts are those it gets alone) or for the whole batch (faster under load; counts depend on the pages sharing it)."),
    ] = Sizing.PAGE,
    draft_workers: Annotated[
        int | None,
        typer.Option(envvar=_env("draft_workers"), help="Processes that render and draft pages ahead of the model (0 = the worker drafts each page when it needs it; default: see README)."),
    ] = None,
    executor: Annotated[
        Executor,
        typer.Option(envvar=_env("executor"), help="Run documents in local worker processes or on a Ray cluster (pip install 'hsd-cli\\[ray]'; OUT must be a path every node sees)."),
    ] = Executor.LOCAL,
    ray_address: Annotated[
        str | None,
        typer.Option(envvar=_env("ray_address"), help="With --executor ray: auto (a running cluster) or HOST:PORT (default: RAY_ADDRESS, else a Ray instance on this machine)."),
    ] = None,
    gpus_per_worker: Annotated[
        float, typer.Option(envvar=_env("gpus_per_worker"), help="With --executor ray: GPUs per worker actor (0 = CPU workers, one per CPU).")
    ] = 0.0,
    events: Annotated[
        str | None, typer.Option(envvar=_env("events"), help="Write NDJSON progress events to FILE, or stdout with '-'.")
    ] = None,
    json: Annotated[
        bool, typer.Option("--json", envvar=_env("json"), help="Print one JSON summary object on stdout.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", envvar=_env("quiet"), help="Only errors and warnings.")] = False,
    debug: Annotated[
        bool, typer.Option("--debug", "-v", envvar=_env("debug"), help="Tracebacks for failed documents.")
    ] = False,
) -> None:
    """Convert documents to Markdown and JSON."""
    from hsd_cli.output.manifest import OutputLockedError
    from hsd_cli.batch.reporting import EventLog, Reporter
    from hsd_cli.batch.runner import ExitCode, read_files_from, run_convert
    from hsd_cli.batch.worker import ExecutorUnavailableError

    console = Console(stderr=True)
    reporter = Reporter(console=console, quiet=quiet, debug=debug)

    def usage(message: str, hint: str | None = None) -> typer.Exit:
        reporter.error(message, hint)
        return typer.Exit(ExitCode.USAGE)

    try:
        if output is None:
            raise usage("no output directory", "give -o OUT (or HSD_OUTPUT, or output in a config file)")
        convert_config = ConvertConfig(
            output_dir=output,
            recursive=recursive,
            pages=pages,
            dpi=dpi,
            max_pixels=max_pixels,
            draft_backend=draft,
            draft_json_dir=draft_json,
            images=images,
            page_markers=page_markers,
            password=password,
            stages=stages,
            model=os.path.expanduser(model) if model else None,
            device=device,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            max_new_tokens=max_new_tokens,
            baseline=baseline,
            profile=profile,
            near_lossless=near_lossless,
            recipe=recipe,
            greedy=greedy,
            seed=seed,
        )
        run_config = RunConfig(
            overwrite=overwrite,
            retry_failed=retry_failed,
            shard=shard,
            page_timeout=page_timeout,
            doc_timeout=doc_timeout,
            max_page_error_rate=max_page_error_rate,
            max_docs_per_worker=max_docs_per_worker,
            max_rows=max_rows,
            sizing=sizing,
            draft_workers=draft_workers,
            executor=executor,
            ray_address=ray_address,
            gpus_per_worker=gpus_per_worker,
        )
    except UsageError as exc:
        raise usage(str(exc)) from None
    if draft_json is not None and draft is not DraftBackendName.PADDLEOCR:
        raise usage("--draft-json needs --draft paddleocr")
    if events == "-" and json:
        raise usage("--events - and --json both want stdout", "write events to a file: --events run.ndjson")
    listed: list[str] = []
    if files_from is not None:
        try:
            listed = read_files_from(files_from, null)
        except OSError as exc:
            raise usage(f"cannot read --files-from {files_from}: {exc.strerror}") from None
    if not inputs and not listed:
        raise usage("no inputs", "give files, directories or globs, or --files-from FILE")
    if convert_config.model is not None:
        from hsd_cli.replay.presets import ReplayModelNotBuilt, resolve_model

        from hsd_cli.replay.reader import as_built

        try:  # a replay model's name (`--model olmocr-replay-qwen2`) is its build in the user cache
            convert_config = as_built(replace(convert_config, model=resolve_model(convert_config.model)))
        except ReplayModelNotBuilt as exc:
            reporter.error(str(exc))
            raise typer.Exit(ExitCode.ENVIRONMENT) from None
    model_config = None
    if convert_config.runs_model:
        if problem := _model_directory_problem(convert_config.model):
            reporter.error(problem, "give a local model directory, or a hub id that is in the HF cache")
            raise typer.Exit(ExitCode.ENVIRONMENT)
        from hsd_cli.decoding.hf_target.families import UnsupportedFamilyError
        from hsd_cli.replay.reader import reader_wrapper  # a benchmark stand-in flags the pages it was not built on
        from hsd_cli.serving.resolve import ModelUnavailableError, RecipeError, resolve_model
        from hsd_cli.settings_files import SettingsFileError

        try:
            model_config = resolve_model(convert_config, reader_wrapper(convert_config.model))
        except ModelUnavailableError as exc:
            reporter.error(str(exc), exc.hint)
            raise typer.Exit(ExitCode.ENVIRONMENT) from None
        except UnsupportedFamilyError as exc:
            hint = "`hsd models` lists the families hsd serves, and those it refuses with the reason"
            raise usage(str(exc), hint) from None
        except RecipeError as exc:
            raise usage(str(exc)) from None
        except SettingsFileError as exc:
            reporter.error(str(exc), "fix or remove it; `hsd models` shows which settings file each family uses")
            raise typer.Exit(ExitCode.USAGE) from None
        if not quiet:
            console.print(f"VLM: {model} ({model_config.family}, recipe {model_config.recipe}), stages {stages.value}", highlight=False)

    try:
        event_stream = sys.stdout if events == "-" else open(events, "a", encoding="utf-8") if events else None
    except OSError as exc:
        raise usage(f"cannot write --events {events}: {exc.strerror}") from None
    try:
        code, summary = run_convert(
            list(inputs or []), convert_config, run_config, reporter, EventLog(event_stream), listed, model_config
        )
    except OutputLockedError as exc:
        reporter.error(str(exc), "wait for it to finish, or use another -o")
        raise typer.Exit(ExitCode.ENVIRONMENT) from None
    except ExecutorUnavailableError as exc:
        reporter.error(str(exc), exc.hint)
        raise typer.Exit(ExitCode.ENVIRONMENT) from None
    except KeyboardInterrupt:
        reporter.error("interrupted: documents finished so far are written and recorded in the manifest")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    finally:
        if event_stream not in (None, sys.stdout):
            event_stream.close()
    if code is ExitCode.NO_INPUT:
        reporter.error("no input matched", "give PDF/image files, directories or globs")
    if json:
        sys.stdout.write(json_lib.dumps(summary, ensure_ascii=False) + "\n")
    raise typer.Exit(code)


@config_app.command(
    "show", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
)
def config_show(ctx: typer.Context) -> None:
    """Print the effective value of every convert option and where it came from.

    Takes the same options as `hsd convert` (e.g. `hsd config show --config my.toml --dpi 200`).
    """
    if "--help" in ctx.args:  # --help is not an option here, so that convert's options pass through
        typer.echo(ctx.get_help(), nl=False)
        raise typer.Exit()
    command = typer.main.get_command(app).commands["convert"]
    try:
        with command.make_context("convert", list(ctx.args)) as convert_ctx:
            rows = describe_sources(convert_ctx)
    except Exception as exc:
        if not hasattr(exc, "format_message"):  # typer's (vendored click's) usage errors have it
            raise
        Console(stderr=True).print(f"[red]error:[/red] {escape(exc.format_message())}", highlight=False)
        raise typer.Exit(2) from None
    console = Console()
    if not console.is_terminal:
        # Plain `key = value  # source` lines: greppable, and valid as a [convert] config table.
        for name, value, where in rows:
            key = name.replace("_", "-")
            line = f"# {key} is unset" if value is None else f"{key} = {json_lib.dumps(str(value) if isinstance(value, Path) else value)}"
            sys.stdout.write(f"{line}  # {where}\n")
        return
    table = Table(title="hsd convert: effective options", title_justify="left")
    for column in ("option", "value", "from"):
        table.add_column(column)
    for name, value, where in rows:
        table.add_row(name.replace("_", "-"), str(value), where)
    console.print(table)


if __name__ == "__main__":
    app()
