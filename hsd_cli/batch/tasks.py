"""What the parent process and a worker exchange about one document.

Kept free of the heavy imports (PyMuPDF and its layout model, rapidocr, torch): the parent imports
only this, so a draft-only run's parent stays small while its worker holds the models.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hsd_cli.config import ConvertConfig, Sizing, Stages
from hsd_cli.batch.inputs import InputDocument, OutputPaths
from hsd_cli.output.json_doc import SCHEMA_VERSION
from hsd_cli.records.kinds import DocStatus
from hsd_cli.records.totals import DecodingTotals

if TYPE_CHECKING:
    from PIL import Image

    from hsd_cli.serving.model import VlmOptions


@dataclass(frozen=True)
class DocumentTask:
    """Everything a worker needs for one document (picklable)."""

    doc: InputDocument
    outputs: OutputPaths
    config: ConvertConfig
    sha256: str
    checkpoint_dir: Path
    max_page_error_rate: float = 0.2
    page_timeout: float = 0.0  # seconds a page may take (0: none); the planner leaves a page it predicts far over to its draft
    lost_pages: dict[int, str] = field(default_factory=dict)  # page_no -> why the parent gave up on it
    reads_page: Callable[[Image.Image], bool] | None = None  # a replay model's pages (VlmOptions.reads_page)
    max_rows: int = 1  # rows the worker's model keeps in flight (--max-rows)
    sizing: Sizing = Sizing.PAGE  # --sizing
    draft_workers: int | None = 0  # processes drafting pages ahead (runner.drafting_processes; 0: the worker drafts; None: by the device)
    # Parts a document with many pages is split into (config.document_parts), each converted as
    # a document of its own so that its pages are in flight together; `part`: which one this is.
    parts: int = 1
    part: int = 0


@dataclass(frozen=True)
class DocumentOutcome:
    """What happened to one input: a row of the run summary and of the manifest."""

    input: str
    status: DocStatus
    error: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    pages: int = 0
    page_count: int = 0
    failed_pages: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    sha256: str | None = None
    draft_backends: dict[str, int] = field(default_factory=dict)
    page_timings: dict[int, dict[str, float]] = field(default_factory=dict)
    decoding: DecodingTotals | None = None  # page-stage totals when a VLM ran
    warnings: tuple[str, ...] = ()
    note: str | None = None  # e.g. why a document was skipped
    traceback: str | None = None  # shown only with --debug
    peak_rss_mib: int | None = None  # the worker's peak resident memory while on this document


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def runs_model(config: ConvertConfig) -> bool:
    """Whether a VLM reads the pages (a model named, and stages beyond the draft)."""
    return config.model is not None and config.stages is not Stages.DRAFT


def vlm_options(
    config: ConvertConfig, reads_page: Callable[[Image.Image], bool] | None = None, max_rows: int = 1,
    sizing: Sizing = Sizing.PAGE,
) -> VlmOptions | None:
    if not runs_model(config):
        return None
    from hsd_cli.serving.model import VlmOptions  # imports torch: only when a VLM will run

    return VlmOptions(
        model=config.model,
        device=config.device,
        dtype=config.dtype,
        trust_remote_code=config.trust_remote_code,
        max_new_tokens=config.max_new_tokens,
        baseline=config.baseline,
        profile=config.profile,
        reads_page=reads_page,
        max_rows=max_rows,
        sizing=sizing,
        near_lossless=config.near_lossless,
    )


# ConvertConfig fields that cannot change a document's output bytes: where outputs go, which
# inputs are found, a password (a wrong one fails the document) and trusting a model's own code
# (a model that needs it fails without it). Every other field is in `output_config`.
OUTPUT_NEUTRAL_FIELDS = frozenset({"output_dir", "recursive", "password", "trust_remote_code"})
# Fields added since outputs were first hashed whose unset value is the behaviour before them:
# recorded (and hashed) only when set, so that a run without them keeps its bytes and resumes.
RECORDED_WHEN_SET_FIELDS = frozenset({"near_lossless"})


def page_timeout_matters(config: ConvertConfig) -> bool:
    """--page-timeout changes output where the planner may leave a page it predicts far over it to
    its draft (`--stages auto` with a model)."""
    return config.model is not None and config.stages is Stages.AUTO


def output_config(config: ConvertConfig, page_timeout: float) -> dict[str, object]:
    """The options that change output bytes (recorded in the JSON, hashed for resume)."""

    def plain(value: object) -> object:
        return value if value is None or isinstance(value, (bool, int, float)) else str(value)

    options = {
        key: plain(value) for key, value in asdict(config).items()
        if key not in OUTPUT_NEUTRAL_FIELDS and not (key in RECORDED_WHEN_SET_FIELDS and value is None)
    }
    return options | ({"page_timeout": page_timeout} if page_timeout_matters(config) else {})


def config_hash(config: ConvertConfig, page_timeout: float) -> str:
    canonical = json.dumps({"schema": SCHEMA_VERSION, **output_config(config, page_timeout)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
