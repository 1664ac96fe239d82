"""DocumentResult -> Markdown."""

from __future__ import annotations

from collections.abc import Callable

from hsd_cli.records.page import DocumentResult, Page
from hsd_cli.records.kinds import Block, BlockKind

# Running heads, page numbers and footers are page furniture: kept in the JSON, not in the text.
_FURNITURE = {BlockKind.PAGE_HEADER, BlockKind.PAGE_FOOTER}


def block_markdown(block: Block, image_ref: str | None) -> str:
    match block.kind:
        case BlockKind.TITLE | BlockKind.SECTION_HEADER:
            return "#" * max(1, min(block.level, 6)) + " " + " ".join(block.text.split())
        case BlockKind.CODE:
            return f"```\n{block.text}\n```"
        case BlockKind.FIGURE:
            parts = [f"![{block.kind.value}]({image_ref})"] if image_ref else []
            return "\n\n".join(parts + ([block.text] if block.text else []))
        case _:
            return block.text


# Where a reading the model broke off (it looped) ends and the draft of the rest of the page begins.
DRAFT_FOLLOWS = "<!-- hsd: the model's reading broke off here (it looped); the rest of this page is the draft -->"


def blocks_markdown(blocks: tuple[Block, ...], image_ref: Callable[[Block], str | None]) -> str:
    out: list[str] = []
    previous: BlockKind | None = None
    for block in blocks:
        text = block_markdown(block, image_ref(block)) if block.kind not in _FURNITURE else ""
        if not text.strip():
            continue
        # Consecutive list items form one tight list rather than one list per item.
        out.append(("\n" if block.kind is previous is BlockKind.LIST else "\n\n") if out else "")
        out.append(text)
        previous = block.kind
    return "".join(out)


def page_markdown(page: Page, image_ref: Callable[[Block], str | None]) -> str:
    if page.text is None:
        return blocks_markdown(page.blocks, image_ref)
    if page.draft_from is None:
        return page.text  # the VLM's page output is the answer; the draft blocks were its drafts
    rest = blocks_markdown(page.blocks[page.draft_from :], image_ref)
    return "\n\n".join(part for part in (page.text, DRAFT_FOLLOWS, rest) if part)


def document_markdown(
    result: DocumentResult, image_ref: Callable[[Block], str | None], page_markers: bool, page_join: str = "\n\n",
) -> str:
    """The pages' Markdown joined as the model's makers join them (`page_join`: the recipe's;
    a blank line is hsd's own), with a page's marker before it where asked."""
    chunks = []
    for page in result.pages:
        body = page_markdown(page, image_ref)
        chunks.append(f"<!-- page {page.page_no} -->\n\n{body}" if page_markers else body)
    return page_join.join(chunk for chunk in chunks if chunk.strip()) + "\n"
