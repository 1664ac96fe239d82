"""Frozen run configuration; one field per CLI option."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path


class DraftBackendName(StrEnum):
    AUTO = "auto"
    PDF_TEXT = "pdf-text"
    OCR = "ocr"
    PADDLEOCR = "paddleocr"


class ImageMode(StrEnum):
    REF = "ref"  # figures saved as PNG beside the Markdown and referenced from it
    NONE = "none"  # figures left out


class Stages(StrEnum):
    """How much of the hierarchy runs. auto: draft only without a model; with one and a cost
    profile, what the planner predicts fastest per page and block (stages/planner.py); without a
    profile, the page stage plus region passes for the blocks whose pipeline draft is uncertain
    (OCR, tables, formulas).
    packed: region passes on every block in the same forwards as the page stage, each region
    output drafting the page as soon as it ends."""

    AUTO = "auto"
    DRAFT = "draft"
    PAGE = "page"
    REGION_PAGE = "region-page"
    PACKED = "packed"


class Executor(StrEnum):
    """Where documents run: worker processes on this machine, or actors on a Ray cluster."""

    LOCAL = "local"
    RAY = "ray"


class Sizing(StrEnum):
    """What each step's tree widths are chosen for, with a cost profile and documents sharing the
    model's batch (--max-rows above 1). PAGE: each page's rows as if every row of the batch were like
    them, so that a page's counts are those it gets alone; but the forward is as wide as its widest
    row, and every row pays for it. BATCH: one width for all the rows in the batch, learned from all
    of them: no row pays for another's nodes, and a page's counts depend on the pages it shared
    forwards with (never its tokens)."""

    PAGE = "page"
    BATCH = "batch"


class UsageError(ValueError):
    """A bad option value; the CLI turns it into exit code 2."""


@dataclass(frozen=True)
class ConvertConfig:
    output_dir: Path
    recursive: bool = True
    pages: str | None = None
    dpi: int = 150
    max_pixels: int = 4_194_304
    draft_backend: DraftBackendName = DraftBackendName.AUTO
    draft_json_dir: Path | None = None
    images: ImageMode = ImageMode.REF
    page_markers: bool = False
    password: str | None = None
    stages: Stages = Stages.AUTO
    model: str | None = None
    device: str | None = None  # None: cuda, then mps, then cpu, whichever is present
    dtype: str | None = None  # None: bfloat16 on accelerators and for large models, per the adapter
    trust_remote_code: bool = False
    max_new_tokens: int | None = None  # None: the model family's setting
    baseline: bool = False
    profile: str | None = None  # cost profile for --stages auto (None: the stored one of the model, if any)
    # --near-lossless TAU: also accept a draft token within TAU of the model's own (never in math);
    # None: lossless, the output is plain decoding's.
    near_lossless: float | None = None
    recipe: str | None = None  # None: the makers' recipe of a known model id, else the family's default
    greedy: bool = False  # decode greedily where the recipe's makers sample
    seed: int = 0  # the keyed sampler's seed where the recipe samples: a seed gives the same text with or without speculation
    # A layout model's directory (PP-DocLayoutV3) for a two-step recipe whose makers find the
    # blocks with one; None: hsd's draft layout stands in for it.
    layout_model: str | None = None

    def __post_init__(self) -> None:
        if self.stages in (Stages.PAGE, Stages.REGION_PAGE, Stages.PACKED) and self.model is None:
            raise UsageError(f"--stages {self.stages.value} needs a VLM: give --model ID|DIR")
        if self.device not in (None, "cpu", "cuda", "mps") and not str(self.device).startswith("cuda:"):
            raise UsageError(f"--device must be cpu, cuda, cuda:N or mps, got {self.device}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise UsageError(f"--dtype must be float32, bfloat16 or float16, got {self.dtype}")
        if not 36 <= self.dpi <= 600:
            raise UsageError(f"--dpi must be between 36 and 600, got {self.dpi}")
        if self.max_pixels < 64 * 64:
            raise UsageError(f"--max-pixels must be at least {64 * 64}, got {self.max_pixels}")
        if self.near_lossless is not None and not 0.0 < self.near_lossless <= 1.0:
            raise UsageError(f"--near-lossless must be within (0, 1], got {self.near_lossless:g}")
        if self.near_lossless is not None and self.model is None:
            raise UsageError("--near-lossless needs a VLM: give --model ID|DIR")
        if self.recipe is not None and self.model is None:
            raise UsageError("--recipe needs a VLM: give --model ID|DIR")
        if self.layout_model is not None and self.model is None:
            raise UsageError("--layout-model needs a VLM: give --model ID|DIR")
        if self.pages is not None:
            parse_page_ranges(self.pages)  # validate early: a typo is a usage error, not N failures

    @property
    def document(self) -> DocumentConfig:
        return DocumentConfig(**{f.name: getattr(self, f.name) for f in fields(DocumentConfig)})

    @property
    def runs_model(self) -> bool:
        """Whether a VLM reads the pages (a model named, and stages beyond the draft)."""
        return self.model is not None and self.stages is not Stages.DRAFT


@dataclass(frozen=True)
class DocumentConfig:
    """How a document's pages are chosen, rendered, drafted and written: the convert options that
    need nothing resolved, taken from ConvertConfig (`.document`), whose defaults they are."""

    pages: str | None  # None: every page
    dpi: int
    max_pixels: int
    draft_backend: DraftBackendName
    draft_json_dir: Path | None
    images: ImageMode
    page_markers: bool
    password: str | None
    stages: Stages


@dataclass(frozen=True)
class ModelConfig:
    """What is read, resolved once in the parent before any worker starts
    (serving.resolve.resolve_model): every field is the value the workers use."""

    model: str  # a local directory or a hub id in the HF cache
    family: str  # its model_type
    device: str  # cpu, cuda, cuda:N or mps
    dtype: str  # float32, bfloat16 or float16
    trust_remote_code: bool
    max_new_tokens: int
    baseline: bool  # also decode plainly, to measure the speedup
    profile: str | None  # the cost profile plans and tree sizes are priced on; None: there is none
    near_lossless: float | None = None  # --near-lossless TAU; None: lossless
    # The recipe's name (hsd_cli.recipes): how the model's makers feed it and read its answer;
    # "": the family's default, hsd's own way with the family.
    recipe: str = ""
    greedy: bool = False  # greedy where the recipe's makers sample
    seed: int = 0  # the keyed sampler's seed
    layout_model: str | None = None  # the layout model's directory (a two-step recipe's); None: the draft's layout
    # Slots a row of the in-place KV store holds (decoding/hf_target/kv_store.py); None: the rows'
    # cache in transformers' DynamicCache. Either way the same tokens (serving.resolve decides).
    kv_store_slots: int | None = None
    # "module:callable" that wraps the model's reader (a benchmark stand-in flags the pages it was
    # not built on); the worker imports it by name, so the product never imports the stand-ins.
    reader_wrapper: str | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    """How the run is scheduled, resolved once in the parent (batch.resolve.resolve_schedule)."""

    rows: int  # rows the model keeps in flight: documents (or parts) a worker converts at once
    sizing: Sizing
    draft_workers: int  # processes drafting pages ahead in a worker (0: the worker drafts)
    page_timeout: float  # 0: no limit
    doc_timeout: float  # 0: no limit
    max_page_error_rate: float
    docs_per_worker: int  # documents a worker serves before it is replaced


@dataclass(frozen=True)
class ResolvedConfig:
    """A run's options as the workers get them, whole: nothing downstream sets a default."""

    document: DocumentConfig
    model: ModelConfig | None  # None: no model reads the pages
    schedule: ScheduleConfig


_RANGE = re.compile(r"^\s*(\d+)?\s*(-)?\s*(\d+)?\s*$")


def parse_page_ranges(spec: str) -> list[tuple[int, int | None]]:
    """'1-3,7,10-' -> [(1, 3), (7, 7), (10, None)]; 1-based, inclusive, None = to the end."""
    ranges: list[tuple[int, int | None]] = []
    for part in spec.split(","):
        match = _RANGE.match(part)
        if not part.strip() or match is None:
            raise UsageError(f"bad page range {part.strip()!r} in --pages {spec!r} (use e.g. 1-3,7)")
        first, dash, last = match.groups()
        if first is None and last is None:
            raise UsageError(f"bad page range {part.strip()!r} in --pages {spec!r}")
        start = int(first) if first is not None else 1
        end = (int(last) if last is not None else None) if dash else start
        if start < 1 or (end is not None and end < start):
            raise UsageError(f"bad page range {part.strip()!r} in --pages {spec!r}")
        ranges.append((start, end))
    return ranges


def select_pages(spec: str | None, page_count: int) -> list[int]:
    """0-based page indices selected by `spec` that exist in a document of `page_count` pages."""
    if spec is None:
        return list(range(page_count))
    chosen: set[int] = set()
    for start, end in parse_page_ranges(spec):
        last = page_count if end is None else min(end, page_count)
        chosen.update(range(start - 1, last))
    return sorted(chosen)


# A part of a split document has at least this many pages: its earlier pages are the prior of its
# later ones (pipeline.DocumentSoFar: the dialect its drafts follow, the planner's tau), which a
# part starts without.
MIN_PART_PAGES = 8


def document_parts(indices: Sequence[int], parts: int) -> list[list[int]]:
    """The selected pages split into at most `parts` runs of consecutive pages of at least
    MIN_PART_PAGES each (the last may be shorter), each converted as a document of its own."""
    size = max(MIN_PART_PAGES, -(-len(indices) // parts))
    return [list(indices[start:start + size]) for start in range(0, len(indices), size)]


def most_parts(selected: int) -> int:
    """Into how many parts a document of `selected` pages splits at most (one, if it has none)."""
    return max(1, -(-selected // MIN_PART_PAGES))


@dataclass(frozen=True)
class RunConfig:
    """How a batch runs: resume, isolation and limits. None of it changes output bytes."""

    overwrite: bool = False
    retry_failed: bool = False
    shard: str | None = None
    page_timeout: float = 600.0
    doc_timeout: float = 0.0
    max_page_error_rate: float = 0.2
    max_docs_per_worker: int = 50  # per row in flight (runner.documents_per_process)
    # Rows the model keeps in flight: documents in flight in one worker (a local process, each Ray
    # actor) when a model runs (runner.documents_in_flight), so that their pages share the
    # model's forwards. None: as the device's memory holds (runner.default_max_rows, serving.rows).
    max_rows: int | None = None
    sizing: Sizing = Sizing.PAGE
    # Processes that render and draft pages ahead of the model in a local worker (None: as
    # runner.drafting_processes chooses; 0: the worker drafts each page itself, when it needs it).
    draft_workers: int | None = None
    executor: Executor = Executor.LOCAL
    ray_address: str | None = None  # None: RAY_ADDRESS, else a Ray instance started for the run
    gpus_per_worker: float = 0.0  # Ray: GPUs each worker actor claims (0 = a CPU worker)

    def __post_init__(self) -> None:
        if self.shard is not None:
            parse_shard(self.shard)
        if self.executor is Executor.LOCAL and (self.ray_address is not None or self.gpus_per_worker):
            raise UsageError("--ray-address and --gpus-per-worker need --executor ray")
        if self.gpus_per_worker < 0:
            raise UsageError(f"--gpus-per-worker must be >= 0, got {self.gpus_per_worker:g}")
        if self.page_timeout < 0 or self.doc_timeout < 0:
            raise UsageError("timeouts must be >= 0 seconds (0 = no limit)")
        if not 0.0 <= self.max_page_error_rate <= 1.0:
            raise UsageError(f"--max-page-error-rate must be within 0..1, got {self.max_page_error_rate}")
        if self.max_docs_per_worker < 1:
            raise UsageError("--max-docs-per-worker must be at least 1")
        if self.max_rows is not None and self.max_rows < 1:
            raise UsageError(f"--max-rows must be at least 1, got {self.max_rows}")
        if self.draft_workers is not None and self.draft_workers < 0:
            raise UsageError(f"--draft-workers must be at least 0, got {self.draft_workers}")


def parse_shard(spec: str) -> tuple[int, int]:
    """'2/4' -> (2, 4): this job takes the second of four shards."""
    try:
        index, count = (int(part) for part in spec.split("/"))
    except ValueError:
        raise UsageError(f"bad --shard {spec!r} (use I/N, e.g. 1/4)") from None
    if not 1 <= index <= count:
        raise UsageError(f"bad --shard {spec!r}: I must be within 1..N")
    return index, count
