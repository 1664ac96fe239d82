"""Acceptance in a real model's tokens, without the model: an oracle target for the decoding
core's own loop.

What a lossless greedy step accepts depends only on the drafts, the proposer and the output
tokens. So a target whose "model" answers, at every tree node, the published output's token at
that node's position stands in for the model: `decode_batch` runs with its own proposers over it
and counts exactly the forwards the model would take, in the model's own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hsd_cli.decoding import DecodeConfig, DecodeRequest, DecodeStats, decode_batch, make_proposer
from hsd_cli.decoding.stats import tau

# arm -> how its drafts are matched (None: the family's `draft_match`). `spans` drafts are the
# output's own paragraphs: the ceiling a region stage that transcribed every block right reaches.
ARMS = {"page": None, "page-tokens": "tokens", "page-chars": "chars", "spans": "tokens"}


@dataclass
class OracleState:
    rows: list[int]
    answers: list[list[int]]  # per row: the published output's tokens, ending in the stop token
    emitted: list[int]  # per row: how many of them the loop has emitted


class OracleTarget:
    """A decoding-core target that answers, at a node of depth d, the published token at the
    position after the row's emitted tokens plus d: the token a lossless model emits there,
    whenever the node's path is the output so far (verification reads no other node).

    Token ids are renumbered densely in order of first use, so a tree's logits span the few
    thousand ids a corpus uses rather than the whole vocabulary (allocating and arg-maxing 150k
    logits per node was 85 % of the run); `encode` and `decode` translate, so the proposers see
    one consistent numbering. A renumbering is a bijection: what verification accepts is the same.
    """

    def __init__(self, tokenizer: Any, answers: dict[str, list[int]], stop_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self._oracle_id: dict[int, int] = {}
        self._tokenizer_id: list[int] = []
        # By prompt: a request's prompt names the page whose published output it answers.
        self.answers = {prompt: self.oracle_ids(ids) for prompt, ids in answers.items()}
        self.stop_token_ids = self.oracle_ids(stop_token_ids)

    def oracle_ids(self, tokenizer_ids: Sequence[int]) -> list[int]:
        for token in tokenizer_ids:
            if token not in self._oracle_id:
                self._oracle_id[token] = len(self._tokenizer_id)
                self._tokenizer_id.append(token)
        return [self._oracle_id[token] for token in tokenizer_ids]

    def tokenizer_ids(self, oracle_ids: Sequence[int]) -> list[int]:
        return [self._tokenizer_id[token] for token in oracle_ids]

    def inputs(self, images: Sequence[Any], prompts: Sequence[str]) -> dict:
        return {"answers": [self.answers[prompt] for prompt in prompts]}

    def _one_hot(self, tokens: list[int]) -> torch.Tensor:
        picks = torch.tensor(tokens).unsqueeze(-1)
        return torch.zeros(*picks.shape[:-1], len(self._tokenizer_id)).scatter_(-1, picks, 1.0)

    def _answer(self, state: OracleState, row: int, position: int) -> int:
        answer = state.answers[row]
        return answer[min(position, len(answer) - 1)]

    def prefill(self, inputs: dict) -> tuple[OracleState, torch.Tensor]:
        answers = inputs["answers"]
        state = OracleState(rows=list(range(len(answers))), answers=list(answers), emitted=[1] * len(answers))
        return state, self._one_hot([answer[0] for answer in answers])

    def forward_tree(
        self, state: OracleState, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sizes = valid.sum(1).tolist() if valid is not None else [depths.shape[1]] * depths.shape[0]
        return self._one_hot([
            self._answer(state, row, state.emitted[row] + depth)
            for row, (row_depths, size) in enumerate(zip(depths.tolist(), sizes)) for depth in row_depths[:size]
        ])

    def commit(self, state: OracleState, width: int, kept_nodes: Sequence[Sequence[int]]) -> None:
        # The accepted path (its root included) is one token per node: accepted draft tokens + bonus.
        state.emitted = [emitted + len(path) for emitted, path in zip(state.emitted, kept_nodes)]

    def keep_rows(self, state: OracleState, keep: Sequence[int]) -> None:
        state.rows = [state.rows[i] for i in keep]
        state.answers = [state.answers[i] for i in keep]
        state.emitted = [state.emitted[i] for i in keep]

    def join(self, states: Sequence[OracleState]) -> OracleState:
        return OracleState(
            rows=[row for state in states for row in state.rows],
            answers=[answer for state in states for answer in state.answers],
            emitted=[emitted for state in states for emitted in state.emitted],
        )

    def encode(self, text: str) -> list[int]:
        return self.oracle_ids(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(self.tokenizer_ids(tokens), skip_special_tokens=skip_special_tokens)


@dataclass(frozen=True)
class BenchPage:
    id: str  # document path relative to --inputs, and page
    kind: str  # born-digital or scan
    output: str  # the published text
    drafts: tuple[str, ...]  # the page stage's drafts from hsd's draft pipeline
    blocks: tuple[BenchBlock, ...] = ()  # the blocks a region pass could read, where the output has their part
    side: int = 0  # the `square_side` of the picture the model reads (what its prefill costs)


@dataclass(frozen=True)
class BenchBlock:
    """A block a region pass could read, with the part of the published output that is its
    reading (as `hsd replay-model build` aligns crops): what a region output verifying the block's
    drafts would be."""

    source: str  # the draft backend that wrote its text
    kind: str
    confidence: float | None
    drafts: tuple[str, ...]  # in the family's dialect, as the region stage drafts it
    output: str


def output_spans(output: str) -> list[str]:
    """The output's own blocks: its paragraphs."""
    return [span.strip() for span in output.split("\n\n") if span.strip()]


def simulate(target: OracleTarget, page_id: str, drafts: Sequence[str], match: str, config: DecodeConfig) -> DecodeStats:
    """Decode one page with the oracle: the real loop and proposer, the model's forwards."""
    request = DecodeRequest(None, page_id, make_proposer(target, drafts, match))
    return decode_batch(target, [request], config)[0].stats


def step_counts(stats: DecodeStats) -> dict[str, Any]:
    steps = stats.forwards - 1  # the prefill proposes nothing
    return {
        "tokens": stats.new_tokens,
        "forwards": stats.forwards,
        "tau": round(stats.tau, 3),
        "nodes_per_step": round(stats.proposed / steps, 2) if steps else 0.0,
        "accepted_per_step": round(stats.mean_accepted, 3),
    }


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens, forwards = sum(r["tokens"] for r in rows), sum(r["forwards"] for r in rows)
    return {"pages": len(rows), "tokens": tokens, "forwards": forwards, "tau": round(tau(tokens, forwards), 3)}


def block_id(page: BenchPage, index: int) -> str:
    return f"{page.id}#{index}"


def block_groups(per_block: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tau of the blocks' drafts against their part of the output, by draft source and block kind:
    what the planner's acceptance estimate per block rests on (stages/planner.py)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for block in per_block:
        groups.setdefault(f"{block['source']}/{block['kind']}", []).append(block)
    return {
        group: {k: v for k, v in totals(rows).items() if k != "pages"} | {"blocks": len(rows)}
        for group, rows in sorted(groups.items())
    }


def run_acceptance(
    pages: Sequence[BenchPage], tokenizer: Any, stop_token_id: int, family_match: str, config: DecodeConfig
) -> dict[str, Any]:
    def answer(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) + [stop_token_id]

    answers = {page.id: answer(page.output) for page in pages}
    answers |= {block_id(page, i): answer(block.output) for page in pages for i, block in enumerate(page.blocks)}
    target = OracleTarget(tokenizer, answers, [stop_token_id])
    per_page = []
    for page in pages:
        arms = {}
        for arm, match in ARMS.items():
            drafts = output_spans(page.output) if arm == "spans" else page.drafts
            arms[arm] = step_counts(simulate(target, page.id, drafts, match or family_match, config))
        per_page.append({"page": page.id, "kind": page.kind, "arms": arms})
    per_block = [
        {"page": page.id, "source": block.source, "kind": block.kind, "confidence": block.confidence,
         **step_counts(simulate(target, block_id(page, i), block.drafts, family_match, config))}
        for page in pages for i, block in enumerate(page.blocks)
    ]
    report: dict[str, Any] = {"arms": {}, "pages": per_page, "blocks": block_groups(per_block), "per_block": per_block}
    for arm in ARMS:
        rows = [p["arms"][arm] for p in per_page]
        kinds = sorted({p["kind"] for p in per_page})
        report["arms"][arm] = {
            **totals(rows),
            "kinds": {kind: totals([p["arms"][arm] for p in per_page if p["kind"] == kind]) for kind in kinds},
        }
    return report
