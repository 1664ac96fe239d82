"""Command line: parses options into frozen config and hands over; holds no conversion logic."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from hsd_cli import __version__
from hsd_cli.config import ConvertConfig, DraftBackendName, ImageMode, Stages, UsageError

app = typer.Typer(
    name="hsd",
    help="Convert PDFs and page images to Markdown + JSON (draft pipeline, VLM with speculative decoding).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


@app.command()
def convert(
    inputs: Annotated[list[str], typer.Argument(help="PDF or image files, directories or glob patterns.")],
    output_dir: Annotated[Path, typer.Option("--output", "-o", help="Output directory (mirrors the input tree).")],
    recursive: Annotated[
        bool, typer.Option("--recursive/--no-recursive", help="Descend into subdirectories of directory inputs.")
    ] = True,
    pages: Annotated[str | None, typer.Option(help="Pages to convert, 1-based, e.g. 1-3,7 or 5-.")] = None,
    dpi: Annotated[int, typer.Option(help="Rendering resolution for page images and OCR.")] = 150,
    max_pixels: Annotated[int, typer.Option(help="Cap on pixels per rendered page (dpi is lowered to fit).")] = 4_194_304,
    draft: Annotated[DraftBackendName, typer.Option(help="Draft backend; auto = text layer, else OCR, per page.")] = (
        DraftBackendName.AUTO
    ),
    draft_json: Annotated[
        Path | None, typer.Option(help="With --draft paddleocr: read PP-StructureV3 result JSON from this directory.")
    ] = None,
    images: Annotated[ImageMode, typer.Option(help="Figures: saved beside the Markdown and referenced, or left out.")] = (
        ImageMode.REF
    ),
    page_markers: Annotated[bool, typer.Option(help="Insert <!-- page N --> before each page.")] = False,
    password: Annotated[str | None, typer.Option(help="Password for encrypted PDFs.")] = None,
    stages: Annotated[Stages, typer.Option(help="How much of the hierarchy runs.")] = Stages.AUTO,
    model: Annotated[str | None, typer.Option(help="VLM id or local directory; without it only the draft runs.")] = None,
    json_summary: Annotated[bool, typer.Option("--json", help="Print one JSON summary object on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors and warnings on stderr.")] = False,
    debug: Annotated[bool, typer.Option("--debug", "-v", help="Tracebacks for failed documents.")] = False,
) -> None:
    """Convert documents to Markdown and JSON."""
    from hsd_cli.runner import ExitCode, Reporter, run_convert

    console = Console(stderr=True)
    try:
        config = ConvertConfig(
            output_dir=output_dir,
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
            model=model,
        )
    except UsageError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(ExitCode.USAGE) from None
    if config.draft_json_dir is not None and config.draft_backend is not DraftBackendName.PADDLEOCR:
        console.print("[red]error:[/red] --draft-json needs --draft paddleocr", highlight=False)
        raise typer.Exit(ExitCode.USAGE)
    if config.model is not None:
        console.print(
            "[red]error:[/red] the VLM stages are not available in this build yet; "
            "run without --model for the draft pipeline",
            highlight=False,
        )
        raise typer.Exit(ExitCode.ENVIRONMENT)

    reporter = Reporter(console=console, quiet=quiet, debug=debug)
    try:
        code, summary = run_convert(inputs, config, reporter)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: finished documents are written", highlight=False)
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if code is ExitCode.NO_INPUT:
        console.print("[red]error:[/red] no input matched (give PDF/image files, directories or globs)")
    if json_summary:
        sys.stdout.write(json.dumps(summary, ensure_ascii=False) + "\n")
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
