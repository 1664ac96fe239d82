"""The one place that orders the stages for a document: render -> draft -> (VLM stages) -> files.

Runs inside a worker process. Each finished page is checkpointed, so a document whose worker was
killed (timeout, crash, SIGKILL of the whole run) resumes at the page where it stopped.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import pickle
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymupdf

from hsd_cli.config import ConvertConfig, ImageMode, Stages, document_parts, select_pages
from hsd_cli.batch.draft_processes import DraftProcesses, default_draft_processes, shared_draft_processes, threads_per_process
from hsd_cli.batch.inputs import InputDocument
from hsd_cli.output.files import write_atomic
from hsd_cli.output.json_doc import document_json
from hsd_cli.output.markdown import document_markdown, page_markdown
from hsd_cli.records.page import DocumentResult, Page, Plan, Reading, Way
from hsd_cli.serving.pipeline_lock import released
from hsd_cli.records.kinds import Block, BlockKind, DocStatus, PageFlag
from hsd_cli.stages.dialect import page_drafts, settled
from hsd_cli.stages.draft import DraftBackend, draft_page, exception_line, make_draft_backend
from hsd_cli.stages.draft.ocr import use_threads
from hsd_cli.stages.outcome import LOST_PAGE_WHY, TIMED_OUT_WHY, draft_standing_in, failed_page, model_reading
from hsd_cli.stages.planner import block_outlooks, fixed_plan, page_kind, picture_side, plan_page
from hsd_cli.stages.rasterize import DocumentError, crop_block, open_document, render_page
from hsd_cli.records.totals import DecodingTotals
from hsd_cli.batch.tasks import DocumentOutcome, DocumentTask, output_config, vlm_options

if TYPE_CHECKING:
    from hsd_cli.serving.model import VlmModel

PAGE_ATTEMPTS = 2  # a page that raises is tried once more before it is marked failed

# (event name, payload) -> None; how the worker tells the parent about progress.
EventSink = Callable[[str, dict[str, Any]], None]


def _figure_crops(page: Page) -> tuple[tuple[str, object], ...]:
    crops = ((block.id, crop_block(page, block.bbox, pad=0)) for block in page.blocks if block.kind is BlockKind.FIGURE)
    return tuple((block_id, crop) for block_id, crop in crops if crop is not None)


def debug_fault(doc: InputDocument, page_no: int, stage: str) -> None:
    """Debug settings, for trying --page-timeout, --doc-timeout, worker deaths and failing pages
    (the tests use them too): HSD_DEBUG_STALL=<file name>:<page>[:vlm] hangs that page's draft (or
    VLM) stage, as a looping decode or a stuck native library would; HSD_DEBUG_CRASH=<file name>:<page>
    kills the worker there, as a segfault would; HSD_DEBUG_RAISE=<file name>:<page>[:vlm] makes the
    stage raise, as a library's error would. Read here only, in the worker."""
    wanted = {f"{doc.path.name}:{page_no}:{stage}"} | ({f"{doc.path.name}:{page_no}"} if stage == "draft" else set())
    if os.environ.get("HSD_DEBUG_STALL", "") in wanted:
        time.sleep(3600)
    if os.environ.get("HSD_DEBUG_CRASH", "") in wanted:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("HSD_DEBUG_RAISE", "") in wanted:
        raise RuntimeError(f"HSD_DEBUG_RAISE on the {stage} stage")


def draft_stage(pdf_page: pymupdf.Page, backend: DraftBackend, config: ConvertConfig) -> Page:
    """Render and draft one page: the page's result when no VLM runs, and its fallback when one fails."""
    page = draft_page(backend, pdf_page, render_page(pdf_page, config.dpi, config.max_pixels))
    return replace(page, figures=_figure_crops(page)) if config.images is ImageMode.REF else page


@dataclass(frozen=True)
class DocumentSoFar:
    """What a document's converted pages tell its next page."""

    outputs: tuple[str, ...] = ()  # the model's page outputs: they settle the drafts' dialect
    tau: tuple[tuple[str, float], ...] = ()  # (page kind, the page stage's tau) where drafts were verified

    def then(self, kind: str, text: str | None, tau: float | None) -> DocumentSoFar:
        """After a page whose model output is `text` (None: unusable; empty: it tells nothing) and
        whose page stage reached `tau` (None: it verified no drafts)."""
        if not text:
            return self
        return DocumentSoFar(self.outputs + (text,), self.tau + (((kind, tau),) if tau is not None else ()))

    @classmethod
    def of(cls, pages: Sequence[Page]) -> DocumentSoFar:
        so_far = cls()
        for page in pages:
            if page.text and page.reading and PageFlag.FALLBACK not in page.flags:
                tau = page.reading.result.stats.tau if page.plan.verifies_drafts else None
                so_far = so_far.then(page_kind(page.backend), page.text, tau)
        return so_far


def plan_stage(page: Page, model: VlmModel, stages: Stages, so_far: DocumentSoFar, time_limit_s: float = 0.0) -> Plan:
    """The plan --stages fixes; for `auto` with a cost profile, the planner's, for a page that may
    take `time_limit_s` (0: no limit)."""
    if stages is not Stages.AUTO or model.profile is None:
        return fixed_plan(stages, page.blocks)
    # Imported here: a draft-only worker never imports torch and transformers.
    from hsd_cli.stages.packed import PACKED_REGIONS
    from hsd_cli.stages.region import REGION_BATCH

    kind = page_kind(page.backend)
    return plan_page(
        model.profile, kind, block_outlooks(page, lambda text: len(model.target.encode(text)), model.settings.region_padding_px),
        picture_side(page), region_batch=REGION_BATCH, packed_regions=PACKED_REGIONS,
        earlier_tau=[tau for seen, tau in so_far.tau if seen == kind], time_limit_s=time_limit_s,
    )


def read_stage(page: Page, model: VlmModel, so_far: DocumentSoFar) -> Reading | None:
    """The model's reading of the page as its plan says (None: the plan leaves the page to its
    draft): region passes, then the page stage verifying the region outputs and the other blocks'
    drafts (packed: both in the same forwards), or plain decoding. Drafts follow the dialect of the
    document's model outputs so far."""
    from hsd_cli.stages.packed import packed_stage
    from hsd_cli.stages.page_stage import page_stage, plain_page_stage
    from hsd_cli.stages.region import region_stage

    plan = page.plan
    settings = settled(model.settings, so_far.outputs)
    started = time.perf_counter()
    match plan.way:
        case Way.DRAFT:
            return None
        case Way.PLAIN:
            reading = plain_page_stage(model, page.picture, settings, page_drafts(page.blocks, settings, page_size=page.size_pt))
        case Way.PACKED:
            # Region passes run inside the page stage's forwards: their seconds are the page's.
            reading = packed_stage(model, page, plan.regions, settings)
        case _:
            regions = region_stage(model, page, plan.regions, settings)
            regions_done = time.perf_counter()
            region_texts = {region.block_id: region.text for region in regions if region.text is not None}
            reading = page_stage(model, page.picture, page_drafts(page.blocks, settings, region_texts, page.size_pt), settings)
            # Drafting without region passes is bookkeeping, not a region stage: no region seconds.
            region_s = regions_done - started if regions else 0.0
            return replace(reading, regions=regions, region_s=region_s, page_s=time.perf_counter() - regions_done)
    return replace(reading, page_s=time.perf_counter() - started)


def vlm_stage(
    drafted: Page, model: VlmModel, stages: Stages, so_far: DocumentSoFar, time_limit_s: float = 0.0,
    deadline: float | None = None,
) -> Page:
    """The page planned and read by the model, with the --baseline reading where asked for; the
    draft, flagged, where the planner predicts the page would not finish within `time_limit_s`,
    or where the reading ran past `deadline` (time.monotonic())."""
    from hsd_cli.stages.page_stage import baseline_check
    from hsd_cli.serving.model import PageTimedOut

    started = time.perf_counter()
    page = replace(drafted, plan=plan_stage(drafted, model, stages, so_far, time_limit_s))
    planned_s = time.perf_counter() - started
    try:
        with model.page_deadline(deadline):
            reading = read_stage(page, model, so_far)
    except PageTimedOut:
        return draft_standing_in(page, PageFlag.TIMEOUT, TIMED_OUT_WHY)
    if reading is None:
        predicted = min(page.plan.predicted_s.values())
        why = (f"the model would take about {predicted:.0f} s, far over --page-timeout {time_limit_s:g} s "
               "(to read it, rerun with a larger --page-timeout and --overwrite)")
        unread = draft_standing_in(page, PageFlag.PREDICTED_TIMEOUT, why)
        return replace(unread, timings=page.timings | {"predicted_s": predicted})
    # Planning is work plain decoding does not do: it counts in the page stage's seconds.
    reading = replace(reading, page_s=reading.page_s + planned_s)
    if model.options.baseline:
        baseline_started = time.perf_counter()
        baseline = baseline_check(model, page.picture, reading)
        reading = replace(reading, baseline=baseline, baseline_page_s=time.perf_counter() - baseline_started)
    return model_reading(page, reading, model.decode_config.max_new_tokens, model.outside_replay_set(page.picture))


def _page_size(page: pymupdf.Page) -> tuple[float, float]:
    return page.rect.width, page.rect.height


def _checkpoint_path(task: DocumentTask, page_no: int, stage: str = "page") -> Path:
    return task.checkpoint_dir / f"{stage}-{page_no:05d}.pickle"


def _load_checkpoint(path: Path) -> Page | None:
    """The page as checkpointed, None where there is none or it is not this hsd's (a checkpoint an
    earlier version wrote, left by a killed run, is redone)."""
    if not path.exists():
        return None
    try:
        with path.open("rb") as handle:
            page = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    if not isinstance(page, Page) or any(not hasattr(page, f.name) for f in fields(Page)):
        return None
    # A reading's field with a default reads as its default where an earlier hsd wrote none: look in its own slots.
    reading = page.reading
    return page if reading is None or isinstance(reading, Reading) and all(f.name in vars(reading) for f in fields(Reading)) else None


@dataclass(frozen=True)
class PageError:
    """The exception a page's stage raised on its last attempt."""

    message: str  # "TypeName: message", on one line
    traceback: str


def _with_retries(work: Callable[[], Any]) -> tuple[Any, PageError | None]:
    """Run `work` up to PAGE_ATTEMPTS times; (result, None) or (None, the last error)."""
    error = None
    for _ in range(PAGE_ATTEMPTS):
        try:
            return work(), None
        except Exception as exc:  # noqa: BLE001 - a bad page must not sink its document
            error = PageError(exception_line(exc), traceback.format_exc())
    return None, error


def _convert_page(
    task: DocumentTask, pdf_page: pymupdf.Page, backend: DraftBackend, vlm: VlmModel | None, emit: EventSink,
    so_far: DocumentSoFar, ahead: DraftsAhead | None = None,
) -> tuple[Page, PageError | None]:
    """Draft (or take the draft made ahead), checkpoint the draft, then the VLM stages (whose
    drafts follow the dialect of the document's model outputs so far); each stage retried once
    (a draft made ahead that raised is made again here). The error is the last one raised. The
    model stops reading the page at --page-timeout from its start."""
    page_no = pdf_page.number + 1
    deadline = time.monotonic() + task.page_timeout if task.page_timeout else None

    def drafted() -> Page:
        if ahead is not None and (made := ahead.take(pdf_page.number)) is not None:
            return made
        debug_fault(task.doc, page_no, "draft")
        return draft_stage(pdf_page, backend, task.config)

    def decoded() -> Page:
        debug_fault(task.doc, page_no, "vlm")
        return vlm_stage(page, vlm, task.config.stages, so_far, task.page_timeout, deadline)

    page, error = _with_retries(drafted)
    if page is None:
        return failed_page(page_no, _page_size(pdf_page), PageFlag.ERROR, f"the draft stage raised {error.message}"), error
    if vlm is not None:
        write_atomic(_checkpoint_path(task, page_no, "draft"), pickle.dumps(page.without_picture()))
        emit("page_drafted", {"page": page_no})
        read, error = _with_retries(decoded)
        page = read or draft_standing_in(page, PageFlag.VLM_ERROR, f"the model failed ({error.message})")
    return page.without_picture(), error


def _metadata(pdf: pymupdf.Document) -> dict[str, str]:
    keys = ("title", "author", "subject", "creator", "producer", "format")
    return {key: pdf.metadata.get(key) or "" for key in keys} if pdf.metadata else {}


def release_freed_memory() -> None:
    """glibc: give the memory freed by a page's OCR back to the OS before the next page.

    Without this the heap fragments (the OCR detector's tensors are tens of MiB each) and keeps
    what it once held: a worker grew from 1.0 to 1.7 GB over 17 mixed documents. Trimming costs
    milliseconds; serving large blocks by mmap instead (a fixed M_MMAP_THRESHOLD) bounds a little
    lower but costs a third more CPU in page faults.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def _vlm_model(task: DocumentTask) -> VlmModel | None:
    """The model of the VLM stages, or None for a draft-only run, whose worker then never imports
    torch and transformers (180 MiB)."""
    options = vlm_options(task.config, task.reads_page, task.max_rows, task.sizing)
    if options is None:
        return None
    from hsd_cli.serving.model import VlmModel

    return VlmModel.shared(options)


# A draft process's open documents and their backends: pages come to it from several documents in
# turn, and a document stays open while its pages keep coming.
_OPENED: dict[tuple[Path, ConvertConfig], tuple[pymupdf.Document, DraftBackend]] = {}
_KEEP_OPENED = 8


def _draft_elsewhere(doc: InputDocument, config: ConvertConfig, index: int) -> Page:
    """In a draft process (draft_processes): page `index` of `doc`, rendered and drafted."""
    key = (doc.path, config)
    if key not in _OPENED:
        if len(_OPENED) >= _KEEP_OPENED:
            _OPENED.pop(next(iter(_OPENED)))[0].close()
        _OPENED[key] = (open_document(doc.path, doc.kind, config.password)[0], make_draft_backend(config, doc.path.stem))
    pdf, backend = _OPENED[key]
    debug_fault(doc, index + 1, "draft")
    page = draft_stage(pdf[index], backend, config)
    release_freed_memory()
    return page


class DraftsAhead:
    """A document's drafts made in the worker's draft processes (--draft-workers), up to `ahead`
    pages before the page that takes them, where a process is free: while a page is in the model,
    its next pages are drafted. A page whose draft was not sent is drafted where it is needed."""

    def __init__(self, processes: DraftProcesses, task: DocumentTask, indices: Sequence[int], ahead: int) -> None:
        self.processes = processes
        self.task = task
        self.ahead = ahead
        self.to_draft = deque(sorted(indices))  # the pages not sent yet, in order
        self.drafting: dict[int, Future] = {}
        self._send()

    def _send(self) -> None:
        while self.to_draft and len(self.drafting) < self.ahead:
            index = self.to_draft[0]
            future = self.processes.try_submit(_draft_elsewhere, self.task.doc, self.task.config, index)
            if future is None:
                return
            self.drafting[self.to_draft.popleft()] = future

    def take(self, index: int) -> Page | None:
        """Page `index` drafted, its wait in its timings; None where it was not sent or its draft
        process died (the caller drafts it). A draft that raised raises."""
        future = self.drafting.pop(index, None)
        while self.to_draft and self.to_draft[0] <= index:  # pages are taken in order: these are the caller's
            self.to_draft.popleft()
        self._send()  # the next pages are drafted while this one waits and then reads
        if future is None:
            return None
        started = time.perf_counter()
        with released():  # the other documents in the process go on meanwhile
            try:
                page = future.result()
            except BrokenProcessPool:
                return None
        return replace(page, timings=page.timings | {"draft_wait_s": time.perf_counter() - started})


def _needs_draft(task: DocumentTask, page_no: int) -> bool:
    return page_no not in task.lost_pages and not _checkpoint_path(task, page_no).exists()


def _drafts_ahead(task: DocumentTask, indices: Sequence[int], vlm: VlmModel | None) -> DraftsAhead | None:
    """Drafts made ahead for these pages, or None where the worker drafts them itself
    (--draft-workers 0, or by default with the model on the CPU). Each document in flight keeps
    enough pages drafting that the processes stay busy, and at least the next one."""
    processes = task.draft_workers
    if processes is None:
        processes = default_draft_processes(vlm is not None and str(vlm.target.device) != "cpu")
    if not processes or not indices:
        return None
    in_flight = task.max_rows if vlm is not None else 1
    started = partial(use_threads, threads_per_process(processes))
    return DraftsAhead(shared_draft_processes(processes, started), task, indices, ahead=max(1, -(-processes // in_flight)))


def convert_document(task: DocumentTask, emit: EventSink) -> tuple[DocumentResult, dict[int, str]]:
    """Convert the selected pages (of a split document: those of the task's part, after a
    "doc_parts" event that says into how many parts it splits), resuming from checkpoints; returns
    the result and failed pages."""
    config = task.config
    pdf, damage = open_document(task.doc.path, task.doc.kind, config.password)
    with pdf:
        indices = select_pages(config.pages, pdf.page_count)
        if not indices:
            raise DocumentError(
                DocStatus.SKIPPED, f"no page of --pages {config.pages} in this document ({pdf.page_count} pages)"
            )
        parts = document_parts(indices, task.parts) if task.parts > 1 else [indices]
        if task.parts > 1:
            emit("doc_parts", {"parts": len(parts)})
        indices = parts[task.part]
        backend = make_draft_backend(config, task.doc.path.stem)
        vlm = _vlm_model(task)
        warnings = [damage] if damage else []
        if pdf.is_repaired:
            warnings.append("the PDF was damaged and has been repaired")
        task.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        ahead = _drafts_ahead(task, [index for index in indices if _needs_draft(task, index + 1)], vlm)
        pages: list[Page] = []
        failures: dict[int, str] = {}
        tracebacks: list[str] = []
        for index in indices:
            page_no = index + 1
            checkpoint = _checkpoint_path(task, page_no)
            result = _load_checkpoint(checkpoint)
            if result is None and page_no in task.lost_pages:
                # The worker was killed on this page: its draft stands in if it got that far.
                reason = PageFlag(task.lost_pages[page_no])
                drafted = _load_checkpoint(_checkpoint_path(task, page_no, "draft"))
                why = LOST_PAGE_WHY[reason]
                result = draft_standing_in(drafted, reason, why) if drafted else failed_page(page_no, _page_size(pdf[index]), reason, why)
                # Checkpointed as any page: the part of a split document that lost it is not the one that writes it.
                write_atomic(checkpoint, pickle.dumps(result))
            if result is None:
                emit("page_started", {"page": page_no})
                result, error = _convert_page(task, pdf[index], backend, vlm, emit, DocumentSoFar.of(pages), ahead)
                tracebacks += [f"page {page_no}:\n{error.traceback}"] if error else []
                write_atomic(checkpoint, pickle.dumps(result))
                release_freed_memory()
                emit("page_done", {"page": page_no, "flags": list(result.flags)})
            if PageFlag.FAILED in result.flags:
                failures[page_no] = str(result.flags[-1])
            pages.append(result.without_figures() if checkpoint.exists() else result)
        warnings += [f"page {page.page_no}: {page.notice}" for page in pages if page.notice]
        result = DocumentResult(
            pages=tuple(pages), page_count=pdf.page_count, metadata=_metadata(pdf), warnings=tuple(warnings),
            damaged=damage is not None, tracebacks=tuple(tracebacks), parts=len(parts),
        )
        return result, failures


def _png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def _page_figures(page: Page, task: DocumentTask) -> tuple[tuple[str, object], ...]:
    """The page's figure crops: held in memory (a page without a checkpoint), else read back from its
    checkpoint (only where the page has a figure block: most pages have none)."""
    has_figure = any(block.kind is BlockKind.FIGURE for block in page.blocks)
    if page.figures or task.config.images is not ImageMode.REF or not has_figure:
        return page.figures
    checkpointed = _load_checkpoint(_checkpoint_path(task, page.page_no))
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

    markdown = document_markdown(result, image_ref, task.config.page_markers)
    source = {
        "path": str(task.doc.path),
        "name": task.doc.path.name,
        "kind": task.doc.kind,
        "sha256": task.sha256,
        "size_bytes": task.doc.path.stat().st_size,
    }
    document = document_json(
        result, source, output_config(task.config, task.page_timeout), lambda page: page_markdown(page, image_ref), image_ref
    )
    write_atomic(outputs.markdown, markdown.encode("utf-8"))
    write_atomic(outputs.json, document.encode("utf-8"))
    written = {"markdown": str(outputs.markdown), "json": str(outputs.json)}
    if figure_files:
        written["images"] = str(outputs.images_dir)
    return written


def _document_status(result: DocumentResult, failures: dict[int, str], max_rate: float) -> DocStatus:
    """Failed pages (no content) count against --max-page-error-rate; draft fallbacks and a
    source that decoded only in part degrade."""
    pages = result.pages
    if failures and len(failures) / len(pages) > max_rate:
        return DocStatus.TIMEOUT if set(failures.values()) == {"timeout"} else DocStatus.FAILED
    if failures or result.damaged or any({PageFlag.FALLBACK, PageFlag.DEGRADED} & set(page.flags) for page in pages):
        return DocStatus.DEGRADED
    return DocStatus.OK


def process_document(task: DocumentTask, emit: EventSink) -> DocumentOutcome:
    """Convert and write one document; every failure becomes a status, never an exception."""
    started = time.perf_counter()
    name = str(task.doc.path)
    try:
        result, failures = convert_document(task, emit)
        status = DocStatus.OK if result.parts > 1 else _document_status(result, failures, task.max_page_error_rate)
        if status.is_failure:
            return DocumentOutcome(
                input=name,
                status=status,
                error=f"{len(failures)} of {len(result.pages)} pages failed "
                f"(above --max-page-error-rate {task.max_page_error_rate:g}): "
                + ", ".join(f"page {page.page_no} {page.notice}" for page in result.pages if page.page_no in failures),
                pages=len(result.pages),
                page_count=result.page_count,
                failed_pages=failures,
                seconds=time.perf_counter() - started,
                sha256=task.sha256,
                warnings=result.warnings,
                traceback="\n".join(result.tracebacks) or None,
            )
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
