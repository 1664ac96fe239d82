"""The words the stages share: layout blocks and their kinds, a page's flags, a document's status.
The page record they fill is in page.py."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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


class PageFlag(StrEnum):
    """The words of a page's `flags` (README lists them). The first says where the text comes
    from; `fallback` and `failed` are followed by their reason."""

    DRAFT_ONLY = "draft_only"  # no model ran: the draft is the page
    VLM = "vlm"  # the model read the page
    FALLBACK = "fallback"  # the draft (or the recipe's fallback) stands in for all or part of the model's reading
    FAILED = "failed"  # the page has no content
    # Reasons after `fallback` or `failed`.
    VLM_ERROR = "vlm_error"  # the model's stages raised
    PREDICTED_TIMEOUT = "predicted_timeout"  # the planner predicts far over --page-timeout
    REPETITION = "repetition"  # the model looped: its reading up to the loop, then the draft
    TIMEOUT = "timeout"  # the page ran past --page-timeout: the model stopped reading it, or its worker was stopped
    CRASH = "crash"  # the worker died on the page twice
    ERROR = "error"  # the draft stage raised twice
    # The makers' tool accepts none of the model's answers (recipes.retry): their fallback
    # stands in, as `text_source` says (the PDF's text layer; nothing, where they drop the page).
    NOT_ACCEPTED = "not_accepted"
    # What else a page's reading or draft is.
    EMPTY = "empty"  # the model read nothing where the draft has text: the page is written empty
    TRUNCATED = "truncated"  # the model's reading stopped at the token budget
    ROTATED = "rotated"  # the model's front matter turned the page; the reading is of the turned page
    NEAR_LOSSLESS = "near_lossless"  # read under --near-lossless: outside math, a close draft token may stand for the model's own
    DEGRADED = "degraded"  # the draft came from OCR of the rendering, or its layout saw part of the page


@dataclass(frozen=True)
class ReaderNote:
    """What a reader says of its own reading of a page (serving.reader.Reader.page_note): a flag
    of its own after the page's flags, and the notice the user is told."""

    flag: str
    notice: str


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
class GroundedBlock:
    """A block as a model's grounding tags place it on the page it read."""

    label: str  # the model's word for the block's kind (DeepSeek-OCR: title, text, table, image, ...)
    boxes: tuple[tuple[float, float, float, float], ...]  # (x0, y0, x1, y1) in the model's coordinates
    text: str  # what the model wrote after the tag, up to the next one


@dataclass(frozen=True)
class Grounding:
    """The layout a model wrote around its text: its blocks, their boxes running from 0 to
    `scale` across the page's width and height, from its top-left corner."""

    scale: int
    blocks: tuple[GroundedBlock, ...]
