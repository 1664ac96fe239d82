"""ICDAR 2013 Table Competition structure score: adjacency relations of non-empty cells.

Each table becomes the set of (cell, nearest non-empty cell to its right) and (cell, nearest
non-empty cell below) pairs, compared by normalised content (lower case, no whitespace), as in
the competition (Göbel et al. 2013). Precision, recall and F1 are per document over all its
tables, against `<doc>-str.xml` or an alternative interpretation, whichever gives the higher F1;
the alternative of `us-035a.pdf` is `us-035b-str.xml` (and `<doc>b-str.xml` in general). The
overall figures are micro averages over the documents.
"""

from __future__ import annotations

import unicodedata
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from hsd_cli.eval.errors import EvalInputError
from hsd_cli.eval.outputs import read_hsd_pages
from hsd_cli.eval.table_grids import Cell, Table, find_tables

Relation = tuple[str, str, str]  # (content, neighbour content, "right" | "down")


def normalise_content(text: str) -> str:
    return "".join(unicodedata.normalize("NFKC", text).lower().split())


def relations(table: Table) -> Counter[Relation]:
    """Adjacency relations of one table; spanning cells relate along every row/column they span."""
    slots: dict[tuple[int, int], Cell] = {}
    for cell in table.cells:
        for r in range(cell.row, cell.row + cell.row_span):
            for c in range(cell.col, cell.col + cell.col_span):
                slots.setdefault((r, c), cell)
    last_row = max((r for r, _ in slots), default=-1)
    last_col = max((c for _, c in slots), default=-1)
    pairs: set[tuple[Cell, Cell, str]] = set()
    for cell in table.cells:
        if not normalise_content(cell.text):
            continue
        for r in range(cell.row, cell.row + cell.row_span):
            neighbour = _first_filled(slots, cell, ((r, c) for c in range(cell.col + cell.col_span, last_col + 1)))
            if neighbour is not None:
                pairs.add((cell, neighbour, "right"))
        for c in range(cell.col, cell.col + cell.col_span):
            neighbour = _first_filled(slots, cell, ((r, c) for r in range(cell.row + cell.row_span, last_row + 1)))
            if neighbour is not None:
                pairs.add((cell, neighbour, "down"))
    return Counter((normalise_content(a.text), normalise_content(b.text), way) for a, b, way in pairs)


def _first_filled(slots: dict[tuple[int, int], Cell], origin: Cell, positions) -> Cell | None:
    for position in positions:
        cell = slots.get(position)
        if cell is not None and cell is not origin and normalise_content(cell.text):
            return cell
    return None


def read_structure(path: Path) -> list[Table]:
    """One Table per <region> of an ICDAR `-str.xml` file (regions of a table may be on several pages)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise EvalInputError(f"{path}: not readable as ICDAR structure XML ({exc})") from None
    tables = []
    for region in root.iter("region"):
        cells = []
        for cell in region.iter("cell"):
            try:
                start_row, start_col = int(cell.get("start-row")), int(cell.get("start-col"))
                end_row = int(cell.get("end-row", start_row))
                end_col = int(cell.get("end-col", start_col))
            except (TypeError, ValueError):
                raise EvalInputError(f"{path}: cell without numeric start-row/start-col") from None
            content = " ".join((cell.findtext("content") or "").split())
            cells.append(Cell(start_row, start_col, content, end_row - start_row + 1, end_col - start_col + 1))
        tables.append(Table(tuple(cells), 0, 0))
    return tables


def alternative_structures(pdf: Path) -> list[Path]:
    """The other valid interpretations shipped for `pdf`: us-035a.pdf -> us-035b-str.xml."""
    names = {f"{pdf.stem}b-str.xml"} | ({f"{pdf.stem[:-1]}b-str.xml"} if pdf.stem.endswith("a") else set())
    return sorted(path for name in names if (path := pdf.with_name(name)).is_file())


def prf(matched: int, predicted: int, truth: int) -> dict[str, float | None]:
    precision = matched / predicted if predicted else None
    recall = matched / truth if truth else None
    f1 = 2 * matched / (predicted + truth) if predicted + truth else None
    return {"precision": precision, "recall": recall, "f1": f1}


def score_document(predicted: list[Table], variants: dict[str, list[Table]]) -> dict[str, Any]:
    """Best-F1 variant of the ground truth against all predicted tables of one document."""
    ours: Counter[Relation] = sum((relations(table) for table in predicted), Counter())
    best: dict[str, Any] | None = None
    for name, truth_tables in variants.items():
        truth: Counter[Relation] = sum((relations(table) for table in truth_tables), Counter())
        matched = sum((ours & truth).values())
        row = {"variant": name, "matched": matched, "predicted": sum(ours.values()), "truth": sum(truth.values())}
        row |= prf(matched, row["predicted"], row["truth"])
        if best is None or (row["f1"] or 0.0) > (best["f1"] or 0.0):
            best = row
    assert best is not None
    return best | {"predicted_tables": len(predicted)}


def score_documents(outputs: Path, icdar_dir: Path) -> dict[str, Any]:
    if not icdar_dir.is_dir():
        raise EvalInputError(f"--icdar directory not found: {icdar_dir}")
    if not outputs.is_dir():
        raise EvalInputError(f"output directory not found: {outputs}")
    pdfs = sorted(p for p in icdar_dir.rglob("*.pdf") if p.with_name(f"{p.stem}-str.xml").is_file())
    if not pdfs:
        raise EvalInputError(f"no ICDAR <doc>.pdf with <doc>-str.xml under {icdar_dir}")
    documents, missing = [], []
    for pdf in pdfs:
        key = pdf.relative_to(icdar_dir).with_suffix("")
        pages = read_hsd_pages(outputs / f"{key.as_posix()}.json")
        if pages is None:
            missing.append(key.as_posix())
            pages = {}
        predicted = [table for _, markdown in sorted(pages.items()) for table in find_tables(markdown)]
        primary = pdf.with_name(f"{pdf.stem}-str.xml")
        variants = {primary.name: read_structure(primary)}
        for alternative in alternative_structures(pdf):
            variants[alternative.name] = read_structure(alternative)
        documents.append({"document": key.as_posix(), **score_document(predicted, variants)})
    totals = {name: sum(doc[name] for doc in documents) for name in ("matched", "predicted", "truth")}
    f1s = [doc["f1"] or 0.0 for doc in documents]
    return {
        "benchmark": "icdar2013-tables",
        "outputs": str(outputs),
        "icdar": str(icdar_dir),
        "overall": prf(totals["matched"], totals["predicted"], totals["truth"])
        | totals
        | {"macro_f1": sum(f1s) / len(f1s), "documents": len(documents)},
        "documents": documents,
        "missing_outputs": missing,
    }
