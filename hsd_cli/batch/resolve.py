"""How a run is scheduled, resolved once in the parent before any worker starts: the rows in
flight, the draft processes, and the documents a worker serves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hsd_cli.config import MIN_PART_PAGES, ConvertConfig, Executor, ModelConfig, RunConfig, ScheduleConfig

if TYPE_CHECKING:
    from hsd_cli.document.inputs import InputDocument
    from hsd_cli.batch.reporting import Reporter


def default_rows(
    config: ConvertConfig, model: ModelConfig, run: RunConfig, reporter: Reporter, documents: list[InputDocument]
) -> int:
    """--max-rows where it is not given: as many rows as the model's device holds (serving.rows:
    one on the CPU), and no more than the run's `documents` split into (serving.rows.run_parts:
    this shard's, those done included, so that a resumed run chooses alike; a long document
    splits into parts of at least MIN_PART_PAGES pages), said on stderr. Per-page sizing prices
    every read at these rows: a run of one short document reads with whole trees, as `generate`'s
    rival, not as one row of a full batch. One on Ray (the driver does not see the actors'
    devices: --max-rows N sets the rows of each actor). A budget that cannot be worked out is
    warned of and gives one row."""
    if run.executor is not Executor.LOCAL or not documents:
        return 1
    # Imports torch (and PyMuPDF to count pages on a GPU): only when a VLM will run.
    from hsd_cli.serving.rows import a4_page, device_rows_choice, run_parts

    try:
        choice = device_rows_choice(model, a4_page(config.dpi, config.max_pixels))
        if choice.rows == 1:
            rows = 1
        else:
            rows = run_parts([(doc.path, doc.kind) for doc in documents], config.pages, config.password, choice.rows)
    except Exception as exc:  # noqa: BLE001 - e.g. a processor that cannot be loaded alone: the run goes on
        reporter.warn(f"cannot budget the rows in flight ({type(exc).__name__}: {exc}); one row, --max-rows N for more")
        return 1
    if not reporter.quiet:
        fewer = ""
        if rows < choice.rows:
            fewer = ", one per document" if rows == len(documents) else f", one per document part of {MIN_PART_PAGES}+ pages"
        reporter.console.print(f"rows in flight: {rows}{fewer} ({choice.why})", highlight=False)
    return rows


def drafting_processes(model: ModelConfig | None, run: RunConfig) -> int:
    """Draft processes beside a worker (--draft-workers; 0: the worker drafts each page itself).
    By default none for a draft-only run (it drafts in its worker, whose memory the README states)
    or on Ray (an actor claims one CPU); where a model reads the pages, as the model's device says
    (draft_processes.default_draft_processes)."""
    if run.draft_workers is not None:
        return run.draft_workers
    if model is None or run.executor is not Executor.LOCAL:
        return 0
    from hsd_cli.document.draft_processes import default_draft_processes

    return default_draft_processes(model.device != "cpu")


def resolve_schedule(
    config: ConvertConfig, model: ModelConfig | None, run: RunConfig, reporter: Reporter, documents: list[InputDocument]
) -> ScheduleConfig:
    """The run's schedule complete. Rows in flight are the documents (or parts of a long one:
    config.document_parts) a worker converts at once: --max-rows where a model reads the pages
    (their rows share its forwards), else one (without a model nothing overlaps: pipeline_lock).
    A worker serves --max-docs-per-worker documents per row before it is replaced: a worker due
    takes no new document until those in flight are done, so its rows empty out for the slowest
    one's tail, and the next worker loads the model again; counted per row, a generation of N rows
    loses that tail once in as many documents as one row's does."""
    if model is None:
        rows = 1
    else:
        rows = run.max_rows or default_rows(config, model, run, reporter, documents)
    return ScheduleConfig(
        rows=rows, sizing=run.sizing, draft_workers=drafting_processes(model, run), page_timeout=run.page_timeout,
        doc_timeout=run.doc_timeout, max_page_error_rate=run.max_page_error_rate,
        docs_per_worker=run.max_docs_per_worker * rows,
    )
