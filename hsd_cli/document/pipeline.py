"""The one place that orders the stages over a page, and the pages over a document:
render -> draft -> (plan -> the model's reading) -> what the page holds, each finished page
checkpointed (document.checkpoints). Runs inside a worker; the document's files are written by
document.writing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pymupdf

from hsd_cli.document.tasks import DocumentTask
from hsd_cli.config import ModelConfig, ScheduleConfig, Stages, document_parts, select_pages
from hsd_cli.document.checkpoints import checkpoint_path, load_checkpoint, save_checkpoint
from hsd_cli.document.drafting import DraftsAhead, draft_stage, drafts_ahead, release_freed_memory
from hsd_cli.document.faults import PageError, debug_fault, with_retries
from hsd_cli.records.kinds import DocStatus, PageFlag
from hsd_cli.records.page import DocumentResult, ModelInput, Page, Plan, Reading, Way
from hsd_cli.stages.dialect import page_drafts, settled
from hsd_cli.stages.draft import DraftBackend, make_draft_backend
from hsd_cli.stages.makers_text import makers_text
from hsd_cli.stages.outcome import LOST_PAGE_WHY, TIMED_OUT_WHY, draft_standing_in, failed_page, model_reading
from hsd_cli.stages.planner import block_outlooks, fixed_plan, page_kind, picture_side, plan_page
from hsd_cli.stages.rasterize import DocumentError, open_document, render_for_model

if TYPE_CHECKING:
    from hsd_cli.serving.reader import Reader

# (event name, payload) -> None; how the worker tells the parent about progress.
EventSink = Callable[[str, dict[str, Any]], None]


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


def plan_stage(page: Page, model: Reader, stages: Stages, so_far: DocumentSoFar, time_limit_s: float = 0.0) -> Plan:
    """The plan --stages fixes; for `auto` with a cost profile, the planner's, for a page that may
    take `time_limit_s` (0: no limit)."""
    two_step = model.recipe.two_step is not None
    if two_step or stages is not Stages.AUTO or model.profile is None:
        return fixed_plan(stages, page.blocks, two_step)
    # Imported here: a draft-only worker never imports torch and transformers.
    from hsd_cli.stages.packed import PACKED_REGIONS
    from hsd_cli.stages.region import REGION_BATCH

    kind = page_kind(page.backend)
    return plan_page(
        model.profile, kind, block_outlooks(page, lambda text: len(model.encode(text)), model.settings.region_padding_px),
        picture_side(page), region_batch=REGION_BATCH, packed_regions=PACKED_REGIONS,
        earlier_tau=[tau for seen, tau in so_far.tau if seen == kind], time_limit_s=time_limit_s,
    )


def read_stage(page: Page, model: Reader, so_far: DocumentSoFar) -> Reading | None:
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
            reading = plain_page_stage(model, page.model_view, settings, page_drafts(page.blocks, settings, page_size=page.size_pt))
        case Way.BLOCKS:
            from hsd_cli.stages.blocks import blocks_stage

            reading = blocks_stage(model, page, settings)
        case Way.PACKED:
            # Region passes run inside the page stage's forwards: their seconds are the page's.
            reading = packed_stage(model, page, plan.regions, settings)
        case _:
            regions = region_stage(model, page, plan.regions, settings)
            regions_done = time.perf_counter()
            region_texts = {region.block_id: region.text for region in regions if region.text is not None}
            reading = page_stage(model, page.model_view, page_drafts(page.blocks, settings, region_texts, page.size_pt), settings)
            # Drafting without region passes is bookkeeping, not a region stage: no region seconds.
            region_s = regions_done - started if regions else 0.0
            return replace(reading, regions=regions, region_s=region_s, page_s=time.perf_counter() - regions_done)
    return replace(reading, page_s=time.perf_counter() - started)


def vlm_stage(
    drafted: Page, model: Reader, stages: Stages, so_far: DocumentSoFar, time_limit_s: float = 0.0,
    deadline: float | None = None, baseline: bool = False, text_layer: Callable[[], str] = str,
) -> Page:
    """The page planned and read by the model, read again where the recipe's makers would not
    accept its answer (their fallback, the PDF's `text_layer` or none, where they accept none),
    with the --baseline reading where asked for; the draft, flagged, where the planner predicts
    the page would not finish within `time_limit_s`, or where the reading ran past `deadline`
    (time.monotonic())."""
    from hsd_cli.serving.reader import PageTimedOut
    from hsd_cli.stages.page_stage import baseline_check
    from hsd_cli.stages.retries import makers_attempts, makers_fallback

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
    tokens = model.prompt_tokens(page.model_view, model.settings.page_prompt)
    try:
        with model.page_deadline(deadline):
            reading = makers_attempts(page, model, reading, tokens, so_far.outputs, time.perf_counter)
    except PageTimedOut:
        return draft_standing_in(page, PageFlag.TIMEOUT, TIMED_OUT_WHY)
    if baseline:
        baseline_started = time.perf_counter()
        with model.attempt(reading.attempt):
            baseline = baseline_check(model, page.model_view, reading)
        reading = replace(reading, baseline=baseline, baseline_page_s=time.perf_counter() - baseline_started)
    reading = makers_text(replace(reading, model_input=ModelInput(model.recipe.name, page.model_view.size, tokens)), model.recipe)
    read = model_reading(page, reading, model.decode_config.max_new_tokens, model.page_note(page.picture))
    return makers_fallback(read, model, text_layer)


def _page_size(page: pymupdf.Page) -> tuple[float, float]:
    return page.rect.width, page.rect.height


def _convert_page(
    task: DocumentTask, pdf_page: pymupdf.Page, backend: DraftBackend, vlm: Reader | None, emit: EventSink,
    so_far: DocumentSoFar, ahead: DraftsAhead | None = None,
) -> tuple[Page, PageError | None]:
    """Draft (or take the draft made ahead), checkpoint the draft, then the VLM stages (whose
    drafts follow the dialect of the document's model outputs so far); each stage retried once
    (a draft made ahead that raised is made again here). The error is the last one raised. The
    model stops reading the page at --page-timeout from its start."""
    page_no = pdf_page.number + 1
    config = task.config
    timeout = config.schedule.page_timeout
    deadline = time.monotonic() + timeout if timeout else None

    def drafted() -> Page:
        if ahead is not None and (made := ahead.take(pdf_page.number)) is not None:
            return made
        debug_fault(task.doc, page_no, "draft")
        return draft_stage(pdf_page, backend, config.document)

    def decoded() -> Page:
        debug_fault(task.doc, page_no, "vlm")
        seen = page if vlm.picture_render is None else replace(page, model_picture=render_for_model(pdf_page, vlm.picture_render))
        return vlm_stage(seen, vlm, config.document.stages, so_far, timeout, deadline, config.model.baseline, pdf_page.get_text)

    page, error = with_retries(drafted)
    if page is None:
        return failed_page(page_no, _page_size(pdf_page), PageFlag.ERROR, f"the draft stage raised {error.message}"), error
    if vlm is not None:
        save_checkpoint(checkpoint_path(task.checkpoint_dir, page_no, "draft"), page.without_picture())
        emit("page_drafted", {"page": page_no})
        read, error = with_retries(decoded)
        page = read or draft_standing_in(page, PageFlag.VLM_ERROR, f"the model failed ({error.message})")
    return page.without_picture(), error


def _metadata(pdf: pymupdf.Document) -> dict[str, str]:
    keys = ("title", "author", "subject", "creator", "producer", "format")
    return {key: pdf.metadata.get(key) or "" for key in keys} if pdf.metadata else {}


def _reader(model: ModelConfig | None, schedule: ScheduleConfig) -> Reader | None:
    """The reader of the VLM stages, or None for a draft-only run, whose worker then never imports
    torch and transformers (180 MiB)."""
    if model is None:
        return None
    from hsd_cli.serving.model import shared_reader

    return shared_reader(model, schedule.rows, schedule.sizing)


def _needs_draft(task: DocumentTask, page_no: int) -> bool:
    return page_no not in task.lost_pages and not checkpoint_path(task.checkpoint_dir, page_no).exists()


def convert_document(task: DocumentTask, emit: EventSink) -> tuple[DocumentResult, dict[int, str]]:
    """Convert the selected pages (of a split document: those of the task's part, after a
    "doc_parts" event that says into how many parts it splits), resuming from checkpoints; returns
    the result and failed pages."""
    config = task.config.document
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
        vlm = _reader(task.config.model, task.config.schedule)
        warnings = [damage] if damage else []
        if pdf.is_repaired:
            warnings.append("the PDF was damaged and has been repaired")
        task.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        ahead = drafts_ahead(task, [index for index in indices if _needs_draft(task, index + 1)])
        pages: list[Page] = []
        failures: dict[int, str] = {}
        tracebacks: list[str] = []
        for index in indices:
            page_no = index + 1
            checkpoint = checkpoint_path(task.checkpoint_dir, page_no)
            result = load_checkpoint(checkpoint)
            if result is None and page_no in task.lost_pages:
                # The worker was killed on this page: its draft stands in if it got that far.
                reason = PageFlag(task.lost_pages[page_no])
                drafted = load_checkpoint(checkpoint_path(task.checkpoint_dir, page_no, "draft"))
                why = LOST_PAGE_WHY[reason]
                result = draft_standing_in(drafted, reason, why) if drafted else failed_page(page_no, _page_size(pdf[index]), reason, why)
                # Checkpointed as any page: the part of a split document that lost it is not the one that writes it.
                save_checkpoint(checkpoint, result)
            if result is None:
                emit("page_started", {"page": page_no})
                result, error = _convert_page(task, pdf[index], backend, vlm, emit, DocumentSoFar.of(pages), ahead)
                tracebacks += [f"page {page_no}:\n{error.traceback}"] if error else []
                save_checkpoint(checkpoint, result)
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


