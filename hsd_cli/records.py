"""Frozen records passed between stages: page image -> draft blocks -> page result -> document."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:
    from hsd_cli.stats import PageStats

# (x0, y0, x1, y1) in PDF points, origin at the top-left corner of the (unrotated) page.
BBox = tuple[float, float, float, float]


class BlockKind(StrEnum):
    TITLE = "title"
    SECTION_HEADER = "section_header"
    TEXT = "text"
    LIST = "list"
    TABLE = "table"
    FORMULA = "formula"
    FIGURE = "figure"
    CAPTION = "caption"
    FOOTNOTE = "footnote"
    CODE = "code"
    PAGE_HEADER = "page_header"
    PAGE_FOOTER = "page_footer"


class DocStatus(StrEnum):
    """Outcome of one document attempt, as written to the summary and the manifest."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CORRUPT = "corrupt"
    ENCRYPTED = "encrypted"
    SKIPPED = "skipped"
    MISSING = "missing"  # a path the user named does not exist

    @property
    def is_failure(self) -> bool:
        return self not in (DocStatus.OK, DocStatus.DEGRADED, DocStatus.SKIPPED)


@dataclass(frozen=True)
class PageImage:
    """One rendered page. `scale` maps PDF points to pixels (pixels = points * scale)."""

    page_no: int  # 1-based
    image: Image.Image
    scale: float
    size_pt: tuple[float, float]


@dataclass(frozen=True)
class Block:
    id: str
    kind: BlockKind
    bbox: BBox
    order: int
    text: str
    confidence: float | None
    source: str  # which draft backend (or later: which model stage) produced the text
    level: int = 0  # heading level 1-6 for titles and section headers
    html: str | None = None  # tables: the HTML form (spans preserved)


@dataclass(frozen=True)
class PageDraft:
    page_no: int
    blocks: tuple[Block, ...]
    backend: str  # the backend that actually ran (auto resolves to pdf-text or ocr)
    seconds: float


@dataclass(frozen=True)
class PageResult:
    page_no: int
    size_pt: tuple[float, float]
    blocks: tuple[Block, ...]
    backend: str
    figures: tuple[tuple[str, Image.Image], ...] = ()  # (block id, crop) for figures
    text: str | None = None  # the VLM's page output; None = the draft blocks are the text
    rejected_text: str | None = None  # the VLM's page output when the draft stood in for it
    flags: tuple[str, ...] = ()  # e.g. "draft_only", "vlm", "fallback"
    timings: dict[str, float] = field(default_factory=dict)
    stats: PageStats | None = None  # None: no VLM stage ran


@dataclass(frozen=True)
class DocumentResult:
    pages: tuple[PageResult, ...]
    page_count: int  # pages in the document (converted pages may be a subset)
    metadata: dict[str, Any]
    warnings: tuple[str, ...] = ()
    damaged: bool = False  # the source (an image cut short) decoded only in part
