"""What a page holds, decided in one place: the model's reading where it reached the user in full,
what stands in where it did not (the draft, whole or after the point where the model looped),
and a failed page's nothing; each with its flags (records.PageFlag) and the one line the user is
told (`notice`: on stderr, in the page JSON). The pipeline calls these and nothing else decides."""

from __future__ import annotations

import re
from dataclasses import replace

from hsd_cli.records.page import Page, Reading
from hsd_cli.records.kinds import Block, BlockKind, PageFlag, ReaderNote

# Page furniture is never in a reading, so it says nothing about where the reading stopped.
_FURNITURE = {BlockKind.PAGE_HEADER, BlockKind.PAGE_FOOTER}
# A block's text is taken as read where this many of its first (or last) letters and digits are in
# the reading: enough not to match by chance, few enough for a model's small departures.
_MATCHED_CHARS = 24
_NOT_WORD = re.compile(r"[\W_]+")


def _letters(text: str) -> str:
    return _NOT_WORD.sub("", text).lower()


def draft_after_reading(blocks: tuple[Block, ...], reading: str) -> int | None:
    """The index of the first block after the last one whose text the reading holds (0 where it
    holds none): the draft from there completes a reading the model broke off. None where no
    block with text follows."""
    read = _letters(reading)
    last_read = -1
    for index, block in enumerate(blocks):
        letters = _letters(block.text)
        if block.kind not in _FURNITURE and len(letters) >= 8:
            if letters[:_MATCHED_CHARS] in read or letters[-_MATCHED_CHARS:] in read:
                last_read = index
    rest = [i for i in range(last_read + 1, len(blocks)) if blocks[i].kind not in _FURNITURE and blocks[i].text.strip()]
    return rest[0] if rest else None


def _draft_text_chars(blocks: tuple[Block, ...]) -> int:
    return sum(len(block.text.strip()) for block in blocks if block.kind not in _FURNITURE)


def model_reading(drafted: Page, read: Reading, budget: int, reader_note: ReaderNote | None = None) -> Page:
    """The page as the model read it. Where it looped, its reading up to the loop and then the
    draft's blocks it had not reached; where it read nothing, an empty page (a blank page's
    reading), flagged `empty` where the draft has text. `reader_note`: what the reader says of
    its own reading, first."""
    flags, notices = [PageFlag.VLM], []
    if reader_note is not None:
        flags.append(reader_note.flag)
        notices.append(reader_note.notice)
    if read.rotation:
        flags.append(PageFlag.ROTATED)
    if read.near_lossless is not None:
        flags.append(PageFlag.NEAR_LOSSLESS)
    result, draft_from = read.result, None
    if result.loop is not None:
        draft_from = draft_after_reading(drafted.blocks, read.text)
        flags += [PageFlag.FALLBACK, PageFlag.REPETITION]
        follows = (f"the draft from block {drafted.blocks[draft_from].id} on completes the page"
                   if draft_from is not None else "nothing of the draft follows it")
        notices.append(
            f"the model looped (a {result.loop.unit}-token unit repeated from output token {result.loop.start}); "
            f"its reading up to the loop is kept and {follows}"
        )
    elif not read.text and (chars := _draft_text_chars(drafted.blocks)):
        flags.append(PageFlag.EMPTY)
        notices.append(f"the model read nothing on this page; it is written empty (the draft had {chars} characters, kept in the JSON's blocks)")
    elif result.stop_reason == "budget":
        flags.append(PageFlag.TRUNCATED)
        notices.append(f"the model's reading reached the token budget ({budget} tokens) and is kept as far as it got (raise --max-new-tokens)")
    return replace(
        drafted, reading=read, text=read.text, flags=tuple(flags), draft_from=draft_from,
        notice="; ".join(notices) or None, timings=drafted.timings | read.timings,
    )


def draft_standing_in(drafted: Page, reason: PageFlag, why: str) -> Page:
    """The draft in place of the model's reading, which did not come (`why` says why)."""
    notice = f"{why}; the draft stands in" + (f" ({drafted.notice})" if drafted.notice else "")
    degraded = (PageFlag.DEGRADED,) if PageFlag.DEGRADED in drafted.flags else ()
    return replace(drafted, flags=(PageFlag.FALLBACK, reason) + degraded, notice=notice)


def failed_page(page_no: int, size_pt: tuple[float, float], reason: PageFlag, why: str) -> Page:
    """A page with no content, so that its document can still be written."""
    return Page(
        page_no=page_no, size_pt=size_pt, flags=(PageFlag.FAILED, reason),
        notice=f"failed ({why}); the page is left empty",
    )


def drafted_page(drafted: Page, degraded_reason: str | None) -> Page:
    """The draft as the page's text (no model runs, or until one does); `degraded` where the
    draft stage had to read the page's rendering or part of its layout."""
    if degraded_reason is None:
        return replace(drafted, flags=(PageFlag.DRAFT_ONLY,))
    return replace(drafted, flags=(PageFlag.DRAFT_ONLY, PageFlag.DEGRADED), notice=degraded_reason)


# Why the parent gave up on a page (worker.py), as a notice says it.
# A page whose reading ran past --page-timeout: its rows left the model's batch.
TIMED_OUT_WHY = "the page ran past --page-timeout and the model stopped reading it"

LOST_PAGE_WHY = {
    PageFlag.TIMEOUT: "the page ran past --page-timeout and its worker was stopped",
    PageFlag.CRASH: "the worker died on this page twice",
}
