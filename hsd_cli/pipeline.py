"""The one place that orders the stages for a document: render -> draft -> (VLM stages) -> files."""

from __future__ import annotations

import hashlib
import io
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pymupdf

from hsd_cli.config import ConvertConfig, ImageMode, select_pages
from hsd_cli.inputs import InputDocument, OutputPaths
from hsd_cli.output.files import write_atomic
from hsd_cli.output.json_doc import document_json
from hsd_cli.output.markdown import document_markdown, page_markdown
from hsd_cli.records import Block, BlockKind, DocStatus, DocumentResult, PageImage, PageResult
from hsd_cli.stages.draft import DraftBackend, draft_page, make_draft_backend
from hsd_cli.stages.rasterize import DocumentError, open_document, render_page


@dataclass(frozen=True)
class DocumentOutcome:
    """What happened to one input: the row of the run summary."""

    input: str
    status: DocStatus
    error: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    pages: int = 0
    page_count: int = 0
    seconds: float = 0.0
    sha256: str | None = None
    draft_backends: dict[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    traceback: str | None = None  # shown only with --debug


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _figure_crops(image: PageImage, blocks: tuple[Block, ...]) -> tuple[tuple[str, object], ...]:
    crops = []
    for block in blocks:
        if block.kind is BlockKind.FIGURE:
            x0, y0, x1, y1 = (round(v * image.scale) for v in block.bbox)
            if x1 - x0 >= 4 and y1 - y0 >= 4:
                crops.append((block.id, image.image.crop((x0, y0, x1, y1))))
    return tuple(crops)


def convert_page(page: pymupdf.Page, backend: DraftBackend, config: ConvertConfig) -> PageResult:
    started = time.perf_counter()
    image = render_page(page, config.dpi, config.max_pixels)
    rendered = time.perf_counter()
    draft = draft_page(backend, page)
    figures = _figure_crops(image, draft.blocks) if config.images is ImageMode.REF else ()
    return PageResult(
        page_no=draft.page_no,
        size_pt=image.size_pt,
        blocks=draft.blocks,
        backend=draft.backend,
        figures=figures,
        flags=("draft_only",),
        timings={"render_s": rendered - started, "draft_s": draft.seconds},
    )


def _metadata(pdf: pymupdf.Document) -> dict[str, str]:
    keys = ("title", "author", "subject", "creator", "producer", "format")
    return {key: pdf.metadata.get(key) or "" for key in keys} if pdf.metadata else {}


def convert_document(doc: InputDocument, config: ConvertConfig) -> DocumentResult:
    """Convert one document's selected pages; raises DocumentError for unusable inputs."""
    pdf = open_document(doc.path, doc.kind, config.password)
    with pdf:
        indices = select_pages(config.pages, pdf.page_count)
        if not indices:
            raise DocumentError(
                DocStatus.SKIPPED, f"no page of --pages {config.pages} in this document ({pdf.page_count} pages)"
            )
        backend = make_draft_backend(config, doc.path.stem)
        warnings = ("the PDF was damaged and has been repaired",) if pdf.is_repaired else ()
        # Pages stream: each is rendered, drafted and reduced to its result before the next.
        pages = tuple(convert_page(pdf[index], backend, config) for index in indices)
        return DocumentResult(pages=pages, page_count=pdf.page_count, metadata=_metadata(pdf), warnings=warnings)


def output_config(config: ConvertConfig) -> dict[str, object]:
    """The options that change output bytes (recorded in the JSON)."""
    wanted = ("pages", "dpi", "max_pixels", "draft_backend", "images", "page_markers", "stages", "model")
    def plain(value: object) -> object:
        return value if value is None or isinstance(value, (bool, int, float)) else str(value)

    return {key: plain(value) for key, value in asdict(config).items() if key in wanted}


def write_document(
    result: DocumentResult, doc: InputDocument, outputs: OutputPaths, config: ConvertConfig, sha256: str
) -> dict[str, str]:
    """Figures, then Markdown, then JSON (last: a present JSON means the set is complete)."""
    figure_files = {}
    for page in result.pages:
        for block_id, crop in page.figures:
            path = outputs.images_dir / f"{block_id}.png"
            buffer = _png_bytes(crop)
            write_atomic(path, buffer)
            figure_files[block_id] = f"{outputs.images_dir.name}/{path.name}"

    def image_ref(block: Block) -> str | None:
        return figure_files.get(block.id)

    markdown = document_markdown(result, image_ref, config.page_markers)
    source = {
        "path": str(doc.path),
        "name": doc.path.name,
        "kind": doc.kind,
        "sha256": sha256,
        "size_bytes": doc.path.stat().st_size,
    }
    document = document_json(
        result, source, output_config(config), lambda page: page_markdown(page, image_ref), image_ref
    )
    write_atomic(outputs.markdown, markdown.encode("utf-8"))
    write_atomic(outputs.json, document.encode("utf-8"))
    written = {"markdown": str(outputs.markdown), "json": str(outputs.json)}
    if figure_files:
        written["images"] = str(outputs.images_dir)
    return written


def _png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def process_document(doc: InputDocument, outputs: OutputPaths, config: ConvertConfig) -> DocumentOutcome:
    """Convert and write one document; every failure becomes a status, never an exception."""
    started = time.perf_counter()
    try:
        sha256 = file_sha256(doc.path)
        result = convert_document(doc, config)
        written = write_document(result, doc, outputs, config, sha256)
    except DocumentError as exc:
        return DocumentOutcome(
            input=str(doc.path), status=exc.status, error=str(exc), seconds=time.perf_counter() - started
        )
    except Exception as exc:  # noqa: BLE001 - one bad document must never end the batch
        return DocumentOutcome(
            input=str(doc.path),
            status=DocStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - started,
            traceback=traceback.format_exc(),
        )
    backends: dict[str, int] = {}
    for page in result.pages:
        backends[page.backend] = backends.get(page.backend, 0) + 1
    return DocumentOutcome(
        input=str(doc.path),
        status=DocStatus.OK,
        outputs=written,
        pages=len(result.pages),
        page_count=result.page_count,
        seconds=time.perf_counter() - started,
        sha256=sha256,
        draft_backends=backends,
        warnings=result.warnings,
    )
