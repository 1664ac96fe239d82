"""A page rendered and drafted: by its document's thread, or ahead in the worker's draft processes
(--draft-workers), so that while a page is in the model its next pages draft in another process."""

from __future__ import annotations

import ctypes
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from functools import partial
from pathlib import Path

import pymupdf

from hsd_cli.document.draft_processes import DraftProcesses, shared_draft_processes, threads_per_process
from hsd_cli.document.inputs import InputDocument
from hsd_cli.document.tasks import DocumentTask
from hsd_cli.config import DocumentConfig, ImageMode
from hsd_cli.document.faults import debug_fault
from hsd_cli.records.kinds import BlockKind
from hsd_cli.records.page import Page
from hsd_cli.serving.pipeline_lock import released
from hsd_cli.stages.draft import DraftBackend, draft_page, make_draft_backend
from hsd_cli.stages.draft.ocr import use_threads
from hsd_cli.stages.rasterize import crop_block, open_document, render_page


def _figure_crops(page: Page) -> tuple[tuple[str, object], ...]:
    crops = ((block.id, crop_block(page, block.bbox, pad=0)) for block in page.blocks if block.kind is BlockKind.FIGURE)
    return tuple((block_id, crop) for block_id, crop in crops if crop is not None)


def draft_stage(pdf_page: pymupdf.Page, backend: DraftBackend, config: DocumentConfig) -> Page:
    """Render and draft one page: the page's result when no VLM runs, and its fallback when one fails."""
    page = draft_page(backend, pdf_page, render_page(pdf_page, config.dpi, config.max_pixels))
    return replace(page, figures=_figure_crops(page)) if config.images is ImageMode.REF else page


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


# A draft process's open documents and their backends: pages come to it from several documents in
# turn, and a document stays open while its pages keep coming.
_OPENED: dict[tuple[Path, DocumentConfig], tuple[pymupdf.Document, DraftBackend]] = {}
_KEEP_OPENED = 8


def _draft_elsewhere(doc: InputDocument, config: DocumentConfig, index: int) -> Page:
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

    def __init__(
        self, processes: DraftProcesses, doc: InputDocument, config: DocumentConfig, indices: Sequence[int], ahead: int,
    ) -> None:
        self.processes = processes
        self.doc = doc
        self.config = config
        self.ahead = ahead
        self.to_draft = deque(sorted(indices))  # the pages not sent yet, in order
        self.drafting: dict[int, Future] = {}
        self._send()

    def _send(self) -> None:
        while self.to_draft and len(self.drafting) < self.ahead:
            index = self.to_draft[0]
            future = self.processes.try_submit(_draft_elsewhere, self.doc, self.config, index)
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


def drafts_ahead(task: DocumentTask, indices: Sequence[int]) -> DraftsAhead | None:
    """Drafts made ahead for these pages, or None where the worker drafts them itself
    (--draft-workers 0, or by default with the model on the CPU). Each document in flight keeps
    enough pages drafting that the processes stay busy, and at least the next one."""
    schedule = task.config.schedule
    processes = schedule.draft_workers
    if not processes or not indices:
        return None
    started = partial(use_threads, threads_per_process(processes))
    ahead = max(1, -(-processes // schedule.rows))
    return DraftsAhead(shared_draft_processes(processes, started), task.doc, task.config.document, indices, ahead)
