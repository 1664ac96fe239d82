"""What the two-step way read of a page: the layout step (where the model itself writes the
layout) and each block's reading, with its box, its maker's label, the model's raw text and the
decoding's counts. The page JSON keeps them (`blocks_json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hsd_cli.records.totals import counts_json

if TYPE_CHECKING:
    from hsd_cli.decoding import DecodeStats


@dataclass(frozen=True)
class BlockReading:
    """One read of the two-step way: a block's crop, or the page's layout step."""

    label: str  # the maker's label ("layout" for the layout step)
    grid: tuple[int, int, int, int]  # the box on the 0-1000 grid of the page the model read
    raw: str  # the model's text as it answered
    text: str  # as its maker writes it into the page's Markdown ("" where the label is dropped)
    stop_reason: str
    counts: DecodeStats  # its forwards and seconds are shared by the batch it was decoded in
    drafted_by: tuple[str, ...] = ()  # the ids of the draft's blocks whose text drafted it
    angle: int = 0  # degrees the crop was turned before reading (MinerU's rotation tags)

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "grid": list(self.grid), "angle": self.angle, "raw": self.raw, "text": self.text,
            "stop_reason": self.stop_reason, "drafted_by": list(self.drafted_by), "counts": counts_json(self.counts),
        }


def blocks_json(layout: BlockReading | None, blocks: tuple[BlockReading, ...]) -> dict[str, Any]:
    """The page JSON's `two_step`: the layout step where the model read one, then every block."""
    record: dict[str, Any] = {"blocks": [block.as_json() for block in blocks]}
    if layout is not None:
        record["layout"] = layout.as_json()
    return record
