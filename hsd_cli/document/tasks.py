"""What the parent process and a worker exchange about one document.

Kept free of the heavy imports (PyMuPDF and its layout model, rapidocr, torch): the parent imports
only this, so a draft-only run's parent stays small while its worker holds the models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from hsd_cli.config import DocumentConfig, ResolvedConfig, Stages
from hsd_cli.document.inputs import InputDocument, OutputPaths
from hsd_cli.output.json_doc import SCHEMA_VERSION
from hsd_cli.recipes.registry import FAMILY_DEFAULT_PREFIX
from hsd_cli.records.kinds import DocStatus
from hsd_cli.records.totals import DecodingTotals


@dataclass(frozen=True)
class DocumentTask:
    """Everything a worker needs for one document (picklable): the run's options resolved whole."""

    doc: InputDocument
    outputs: OutputPaths
    config: ResolvedConfig
    sha256: str
    checkpoint_dir: Path
    lost_pages: dict[int, str] = field(default_factory=dict)  # page_no -> why the parent gave up on it
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


# Options added since outputs were first hashed whose unset value is the behaviour before them:
# recorded (and hashed) only when set, so that a run without them keeps its bytes and resumes. A
# recipe is set where it is a makers' one: a family's default is hsd's way before recipes.
RECORDED_WHEN_SET_FIELDS = ("near_lossless", "recipe", "greedy", "seed", "layout_model")


def _set(key: str, value: object) -> bool:
    if key == "recipe":
        return bool(value) and not value.startswith(FAMILY_DEFAULT_PREFIX)
    return value not in (None, False, 0)


def page_timeout_matters(config: ResolvedConfig) -> bool:
    """--page-timeout changes output where the planner may leave a page it predicts far over it to
    its draft (`--stages auto` with a model)."""
    return config.model is not None and config.document.stages is Stages.AUTO


# Convert options that cannot change a document's output bytes: where outputs go, which inputs
# are found, a password (a wrong one fails the document) and trusting a model's own code (a model
# that needs it fails without it). Every other option is in `output_config` (tests/test_config.py
# holds it): a document option as given, a model option as resolved.
OUTPUT_NEUTRAL_FIELDS = frozenset({"output_dir", "recursive", "password", "trust_remote_code"})
_DOCUMENT_FIELDS = tuple(f.name for f in fields(DocumentConfig) if f.name not in OUTPUT_NEUTRAL_FIELDS)
_MODEL_FIELDS = ("model", "device", "dtype", "max_new_tokens", "baseline", "profile")
# The model options of a run no model reads: nothing read, nothing compared.
_NO_MODEL = {"model": None, "device": None, "dtype": None, "max_new_tokens": None, "baseline": False, "profile": None}


def output_config(config: ResolvedConfig) -> dict[str, object]:
    """The options that change output bytes (recorded in the JSON, hashed for resume)."""

    def plain(value: object) -> object:
        return value if value is None or isinstance(value, (bool, int, float)) else str(value)

    document = {key: plain(getattr(config.document, key)) for key in _DOCUMENT_FIELDS}
    model = {key: plain(getattr(config.model, key)) for key in _MODEL_FIELDS} if config.model else _NO_MODEL
    when_set = {key: plain(value) for key in RECORDED_WHEN_SET_FIELDS if _set(key, value := getattr(config.model, key, None))}
    timeout = {"page_timeout": config.schedule.page_timeout} if page_timeout_matters(config) else {}
    return document | model | when_set | timeout


def config_hash(config: ResolvedConfig) -> str:
    canonical = json.dumps({"schema": SCHEMA_VERSION, **output_config(config)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
