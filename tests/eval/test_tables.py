"""Table parsing, TEDS and ICDAR adjacency on tiny tables whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from hsd_cli.eval.icdar import normalise_content, prf, relations, score_document
from hsd_cli.eval.table_grids import Cell, Table, find_tables, html_table, remove_tables

GRID = "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"


def test_pipe_and_html_tables_are_found_in_order_with_spans():
    markdown = (
        "Intro | not a table\n\n| h1 | h2 |\n|:---|---:|\n| x | y \\| z |\n\n"
        'Then <table><tr><th rowspan="2">s</th><td>1</td></tr><tr><td>2</td></tr></table>'
    )
    pipe, html = find_tables(markdown)
    assert [[c.text for c in row] for row in pipe.rows] == [["h1", "h2"], ["x", "y | z"]]
    assert [(c.row, c.col, c.row_span) for c in html.cells] == [(0, 0, 2), (0, 1, 1), (1, 1, 1)]
    assert remove_tables(markdown).split() == ["Intro", "|", "not", "a", "table", "Then"]


def test_teds_on_known_trees():
    teds = pytest.importorskip("hsd_cli.eval.teds", reason="needs apted (eval extra)").teds
    truth = html_table(GRID)
    assert teds(truth, truth) == 1.0
    # same grid as a pipe table: the tree ignores how the table was written
    assert teds(find_tables("| a | b |\n|---|---|\n| c | d |")[0], truth) == 1.0
    # one row missing: 3 insertions over max(4, 7) nodes
    assert teds(html_table("<table><tr><td>a</td><td>b</td></tr></table>"), truth) == pytest.approx(1 - 3 / 7)
    # one cell text wrong: rename cost 1 (b -> x) over 7 nodes; structure alone is perfect
    wrong = html_table(GRID.replace(">b<", ">x<"))
    assert teds(wrong, truth) == pytest.approx(1 - 1 / 7)
    assert teds(wrong, truth, structure_only=True) == 1.0
    # half-wrong text costs half: "ab" vs "ax"
    half = html_table(GRID.replace(">b<", ">ab<")), html_table(GRID.replace(">b<", ">ax<"))
    assert teds(*half) == pytest.approx(1 - 0.5 / 7)
    # a spanning cell differs in structure: rename 1 + delete 1 over 7 nodes
    merged = html_table('<table><tr><td colspan="2">a</td></tr><tr><td>c</td><td>d</td></tr></table>')
    assert teds(merged, truth, structure_only=True) == pytest.approx(1 - 2 / 7)
    assert teds(None, truth) == 0.0


def _table(rows: list[list[str]]) -> Table:
    cells = [Cell(r, c, text) for r, row in enumerate(rows) for c, text in enumerate(row)]
    return Table(tuple(cells), 0, 0)


def test_adjacency_relations_skip_blank_cells_and_follow_spans():
    table = _table([["A", "", "B"], ["C", "D", ""]])
    assert sorted(relations(table).elements()) == sorted(
        [("a", "b", "right"), ("c", "d", "right"), ("a", "c", "down")]
    )
    # a header spanning two columns relates to both cells below it
    spanning = Table((Cell(0, 0, "Head", 1, 2), Cell(1, 0, "x"), Cell(1, 1, "y")), 0, 0)
    assert sorted(relations(spanning).elements()) == sorted(
        [("head", "x", "down"), ("head", "y", "down"), ("x", "y", "right")]
    )
    assert normalise_content(" Total \n Sum ") == "totalsum"


def test_adjacency_precision_recall_and_best_variant():
    truth = _table([["A", "B"], ["C", "D"]])  # 4 relations
    predicted = _table([["A", "B"], ["C", "X"]])  # A-B and A-C match; C-X, B-X do not
    row = score_document([predicted], {"str": [truth]})
    assert (row["matched"], row["predicted"], row["truth"]) == (2, 4, 4)
    assert (row["precision"], row["recall"], row["f1"]) == (0.5, 0.5, 0.5)
    assert score_document([predicted], {"str": [truth], "t-b-str.xml": [predicted]})["variant"] == "t-b-str.xml"
    nothing = score_document([], {"str": [truth]})
    assert (nothing["precision"], nothing["recall"], nothing["f1"]) == (None, 0.0, 0.0)
    assert prf(0, 0, 0) == {"precision": None, "recall": None, "f1": None}
