"""A converted document's files and outcome: figures, Markdown and JSON written atomically, the
document's status judged from its pages, and every failure turned into a status."""

from __future__ import annotations

import io
import time
import traceback

from hsd_cli.document.tasks import DocumentOutcome, DocumentTask, output_config
from hsd_cli.config import ImageMode
from hsd_cli.document.checkpoints import checkpoint_path, load_checkpoint
from hsd_cli.document.pipeline import EventSink, convert_document
from hsd_cli.output.files import write_atomic
from hsd_cli.output.json_doc import document_json
from hsd_cli.output.markdown import document_markdown, page_markdown
from hsd_cli.recipes.registry import recipe_named
from hsd_cli.records.kinds import Block, BlockKind, DocStatus, PageFlag
from hsd_cli.records.page import DocumentResult, Page
from hsd_cli.records.totals import DecodingTotals
from hsd_cli.stages.rasterize import DocumentError


def _png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def _page_figures(page: Page, task: DocumentTask) -> tuple[tuple[str, object], ...]:
    """The page's figure crops: held in memory (a page without a checkpoint), else read back from its
    checkpoint (only where the page has a figure block: most pages have none)."""
    has_figure = any(block.kind is BlockKind.FIGURE for block in page.blocks)
    if page.figures or task.config.document.images is not ImageMode.REF or not has_figure:
        return page.figures
    checkpointed = load_checkpoint(checkpoint_path(task.checkpoint_dir, page.page_no))
    return checkpointed.figures if checkpointed else ()


def write_document(result: DocumentResult, task: DocumentTask) -> dict[str, str]:
    """Figures, then Markdown, then JSON (last: a present JSON means the set is complete)."""
    outputs = task.outputs
    figure_files = {}
    for page in result.pages:
        for block_id, crop in _page_figures(page, task):
            path = outputs.images_dir / f"{block_id}.png"
            write_atomic(path, _png_bytes(crop))
            figure_files[block_id] = f"{outputs.images_dir.name}/{path.name}"

    def image_ref(block: Block) -> str | None:
        return figure_files.get(block.id)

    model = task.config.model
    page_join = recipe_named(model.recipe, model.family).output.page_join if model else "\n\n"
    markdown = document_markdown(result, image_ref, task.config.document.page_markers, page_join)
    source = {
        "path": str(task.doc.path),
        "name": task.doc.path.name,
        "kind": task.doc.kind,
        "sha256": task.sha256,
        "size_bytes": task.doc.path.stat().st_size,
    }
    document = document_json(result, source, output_config(task.config), lambda page: page_markdown(page, image_ref), image_ref)
    write_atomic(outputs.markdown, markdown.encode("utf-8"))
    write_atomic(outputs.json, document.encode("utf-8"))
    written = {"markdown": str(outputs.markdown), "json": str(outputs.json)}
    if figure_files:
        written["images"] = str(outputs.images_dir)
    return written


def document_status(result: DocumentResult, failures: dict[int, str], max_rate: float) -> DocStatus:
    """Failed pages (no content) count against --max-page-error-rate; draft fallbacks and a
    source that decoded only in part degrade."""
    pages = result.pages
    if failures and len(failures) / len(pages) > max_rate:
        return DocStatus.TIMEOUT if set(failures.values()) == {"timeout"} else DocStatus.FAILED
    if failures or result.damaged or any({PageFlag.FALLBACK, PageFlag.DEGRADED} & set(page.flags) for page in pages):
        return DocStatus.DEGRADED
    return DocStatus.OK


def _too_many_failed(task: DocumentTask, result: DocumentResult, failures: dict[int, str], status: DocStatus, seconds: float) -> DocumentOutcome:
    max_rate = task.config.schedule.max_page_error_rate
    return DocumentOutcome(
        input=str(task.doc.path),
        status=status,
        error=f"{len(failures)} of {len(result.pages)} pages failed (above --max-page-error-rate {max_rate:g}): "
        + ", ".join(f"page {page.page_no} {page.notice}" for page in result.pages if page.page_no in failures),
        pages=len(result.pages),
        page_count=result.page_count,
        failed_pages=failures,
        seconds=seconds,
        sha256=task.sha256,
        warnings=result.warnings,
        traceback="\n".join(result.tracebacks) or None,
    )


def process_document(task: DocumentTask, emit: EventSink) -> DocumentOutcome:
    """Convert and write one document; every failure becomes a status, never an exception."""
    started = time.perf_counter()
    name = str(task.doc.path)
    try:
        result, failures = convert_document(task, emit)
        max_rate = task.config.schedule.max_page_error_rate
        status = DocStatus.OK if result.parts > 1 else document_status(result, failures, max_rate)
        if status.is_failure:
            return _too_many_failed(task, result, failures, status, time.perf_counter() - started)
        # A part of a split document is judged and written with its document (runner: the assembly).
        written = write_document(result, task) if result.parts == 1 else {}
    except DocumentError as exc:
        return DocumentOutcome(
            input=name, status=exc.status, error=str(exc), seconds=time.perf_counter() - started, sha256=task.sha256
        )
    except Exception as exc:  # noqa: BLE001 - one bad document must never end the batch
        return DocumentOutcome(
            input=name,
            status=DocStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - started,
            sha256=task.sha256,
            traceback=traceback.format_exc(),
        )
    backends: dict[str, int] = {}
    for page in result.pages:
        backends[page.backend] = backends.get(page.backend, 0) + 1
    return DocumentOutcome(
        decoding=DecodingTotals.total(page.reading.totals for page in result.pages if page.reading),
        input=name,
        status=status,
        error=None,
        outputs=written,
        pages=len(result.pages),
        page_count=result.page_count,
        failed_pages=failures,
        seconds=time.perf_counter() - started,
        sha256=task.sha256,
        draft_backends=backends,
        page_timings={page.page_no: page.timings for page in result.pages},
        warnings=result.warnings,
        traceback="\n".join(result.tracebacks) or None,
    )
