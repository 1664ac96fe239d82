"""TEDS, tree-edit-distance similarity of tables (Zhong et al., PubTabNet), with `apted`.

Both tables become the tree table -> tr -> td (no thead/tbody, th counted as td, so a pipe
table and an HTML table of the same grid agree). Inserting or deleting a node costs 1;
renaming costs 1 when the tag or the spans differ, else for cells the normalised Levenshtein
distance of their texts (0 for TEDS-S, structure only).
TEDS = 1 - distance / max(node count of either tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apted import APTED, Config
from rapidfuzz.distance import Levenshtein

from hsd_cli.eval.table_grids import Table


@dataclass
class _Node:
    tag: str
    row_span: int = 1
    col_span: int = 1
    text: str = ""
    children: list[_Node] = field(default_factory=list)


def _tree(table: Table, with_text: bool) -> _Node:
    rows = [
        _Node("tr", children=[_Node("td", c.row_span, c.col_span, c.text if with_text else "") for c in row])
        for row in table.rows
    ]
    return _Node("table", children=rows)


class _CellCost(Config):
    def rename(self, node1: _Node, node2: _Node) -> float:
        if (node1.tag, node1.row_span, node1.col_span) != (node2.tag, node2.row_span, node2.col_span):
            return 1.0
        if node1.tag == "td":
            return Levenshtein.normalized_distance(node1.text, node2.text)
        return 0.0

    def children(self, node: _Node) -> list[_Node]:
        return node.children


def _size(node: _Node) -> int:
    return 1 + sum(_size(child) for child in node.children)


def teds(predicted: Table | None, truth: Table, structure_only: bool = False) -> float:
    """Similarity in [0, 1]; a missing prediction scores 0."""
    if predicted is None:
        return 0.0
    tree_pred, tree_true = _tree(predicted, not structure_only), _tree(truth, not structure_only)
    distance = APTED(tree_pred, tree_true, _CellCost()).compute_edit_distance()
    return 1.0 - distance / max(_size(tree_pred), _size(tree_true))
