"""The pages a batched arm reads: measured (throughput_runs) and projected (corpus_projection) alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# A batched arm streams the pages, cycled, until this many times its rows have been read: a
# saturated engine's rate, not a small corpus's tail of ever fewer rows.
FILL = 3


def cycled(pages: Sequence[Any], rows: int) -> list[Any]:
    """The pages a batched arm reads at `rows`: cycled to FILL times the rows where they are fewer."""
    return [pages[i % len(pages)] for i in range(max(len(pages), FILL * rows if rows > 1 else 0))]
