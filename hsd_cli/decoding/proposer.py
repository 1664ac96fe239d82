"""Draft-target matching: turn a set of drafts into a token tree to verify at each step.

Proposers are small CPU objects over plain token lists; they never see a model. Each step the
loop calls `start()` once per sequence, then each step `propose(context)` (context = every token
emitted so far; its last token is the root) and `observe(accepted)` with the draft tokens the
target accepted (bonus excluded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .tree import TokenTree
from .trie import Continuation, Source, build_trie, ranked_node_source, ranked_trie


@dataclass(frozen=True)
class ProposerConfig:
    window_min: int = 3  # n-gram window for the unique-match test
    window_max: int = 10
    chain_max: int = 32  # acceptance rarely runs past a few dozen tokens
    trie_depth: int = 15
    trie_continuations: int = 16  # best-matching occurrences put in a trie (bounds the cost on long drafts)
    trie_budget: int = 40  # draft nodes per trie; CPU forwards grow with width, so keep it small
    # Tries shrink towards `trie_budget_min` while they keep failing (every node costs compute
    # and wrong ones buy nothing): budget = min + (max - min) * recent share of trie steps
    # that accepted a token, averaged with weight `trie_hit_weight` on the latest step.
    trie_budget_min: int = 4
    trie_hit_weight: float = 0.25
    # The sequence's own output is a draft too (as vLLM's n-gram proposer looks up its output):
    # what repeats in a page (LaTeX commands, table markup, list marks) no draft of it holds.
    own_output: bool = True


class Proposer(Protocol):
    # What a sizer learns acceptance per (with each tree's evidence): proposers of one kind draft
    # alike, so what one row of a kind accepted tells how the next row of that kind will.
    kind: str  # "tokens" or "chars" (how it matches drafts, as `make_proposer` names it), "plain"

    def start(self) -> None:
        """Forget the per-sequence state (window, last tree) before decoding a sequence."""

    def propose(self, context: Sequence[int]) -> TokenTree: ...

    def observe(self, accepted: Sequence[int]) -> None: ...


class DraftSink(Protocol):
    """A proposer that takes more drafts between steps."""

    def add_drafts(self, drafts: Sequence[Sequence[int]]) -> None: ...


@functools.lru_cache(maxsize=4096)
def root_alone(root: int) -> TokenTree:
    """The tree of a plain step: trees are immutable, so every plain row of every step shares one
    per root token instead of building its own."""
    return TokenTree((root,), (-1,))


class NoDraftProposer:
    """Plain decoding: every step verifies the root alone."""

    kind = "plain"

    def start(self) -> None:
        pass

    def propose(self, context: Sequence[int]) -> TokenTree:
        return root_alone(context[-1])

    def observe(self, accepted: Sequence[int]) -> None:
        pass


def _matched_suffix(context: Sequence[int], draft: Sequence[int], end: int, limit: int) -> int:
    """How many tokens ending at context[-1] equal the draft tokens ending at draft[end]."""
    most = min(limit, end + 1, len(context))
    ours, theirs = context[len(context) - most :], draft[end + 1 - most : end + 1]
    if ours == theirs:  # a whole match, compared in C: the occurrences the proposer follows
        return most
    return next(length for length in range(most) if ours[-1 - length] != theirs[-1 - length])


class DraftProposer:
    """Exact token matching against a set of drafts (the region stage's pipeline texts).

    - the last `window` context tokens occur exactly once (across all drafts) -> propose the
      rest of that draft as a chain;
    - otherwise a trie of what follows every occurrence of the last token, ranked by how much
      context each occurrence matches;
    - no occurrence -> a plain step.
    The window starts at `window_min`, grows by the accepted tokens while matches are
    ambiguous (capped at `window_max`) and resets when a lookup finds zero or one match.
    With `own_output`, the tokens emitted so far are one more draft, looked up like the others.

    Resynchronisation: when verification stops after draft token at position p, the target's
    bonus token Y ends the context and often matches nothing (it replaced the draft's token).
    The next trie then also holds the draft after p + 1 (Y replaced the draft token) and from
    p + 1 on (Y was inserted), ranked first, as chains of up to `chain_max` tokens.
    """

    kind = "tokens"

    def __init__(self, drafts: Sequence[Sequence[int]], config: ProposerConfig = ProposerConfig()):
        self.config = config
        # The sequence's output so far, then the drafts; a draft position is (list index, position).
        self._lists: list[list[int]] = [[]]
        # token -> (list, position) of every occurrence that has a following token
        self.occurrences: dict[int, list[tuple[int, int]]] = {}
        self.add_drafts(drafts)
        self.start()

    def add_drafts(self, drafts: Sequence[Sequence[int]]) -> None:
        """More drafts, from the next step on (a region output that just ended). Earlier drafts
        keep their indices, so the window and the last accepted position stay valid."""
        for draft in drafts:
            if len(draft) < 2:
                continue
            draft_index = len(self._lists)
            self._lists.append(list(draft))
            for position, token in enumerate(draft[:-1]):
                self.occurrences.setdefault(token, []).append((draft_index, position))

    def start(self) -> None:
        self._forget_output()
        self.window = self.config.window_min
        self._ambiguous = False
        self._tree: TokenTree | None = None
        # What the last tree was copied from: a chain's (draft, position of its root), or a trie's continuations, ranked
        self._copied: tuple[int, int] | list[Continuation] = []
        self._stop: Source = None  # draft position of the last accepted draft token
        self._trie_hit_rate = 1.0
        self._trie_budget = self._budget_at(self._trie_hit_rate)
        self._was_trie = False

    @property
    def drafts(self) -> list[list[int]]:
        """The drafts given, without the output."""
        return self._lists[1:]

    def _forget_output(self) -> None:
        output, self._lists[0] = self._lists[0], []
        for token in set(output[:-1]):  # the last token was never indexed
            self.occurrences[token] = [item for item in self.occurrences[token] if item[0] != 0]

    def _index_output(self, context: Sequence[int]) -> None:
        """Take the tokens emitted since the last step into the output's list. Its last token,
        the root, has no follower yet, so it is indexed at the next step."""
        output, occurrences = self._lists[0], self.occurrences
        known = len(output)
        if len(context) <= known:
            return
        output += context[known:]
        for position in range(max(known - 1, 0), len(output) - 1):
            found = occurrences.get(output[position])  # not setdefault: it builds a list per call
            if found is None:
                occurrences[output[position]] = [(0, position)]
            else:
                found.append((0, position))

    def propose(self, context: Sequence[int]) -> TokenTree:
        config = self.config
        if config.own_output:
            self._index_output(context)
        root = context[-1]
        # The root's occurrences (as in `occurrences`, not copied) and how much context each matches
        occurrences = self.occurrences.get(root) or []
        scores = self._scores(context, occurrences, config.window_max) if occurrences else []
        window = min(self.window, len(context))
        full_matches = 0 if not scores or max(scores) < window else sum(score >= window for score in scores)
        self._ambiguous = full_matches > 1
        self._was_trie = full_matches != 1
        if full_matches == 1:
            at = scores.index(max(scores))  # the one match of the whole window matches most
            draft, position = occurrences[at]
            chain = self._lists[draft][position + 1 : position + 1 + config.chain_max]
            self._tree = TokenTree.chain(root, chain, evidence=scores[at])
            self._copied = (draft, position)
            return self._tree
        self._copied = continuations = self._ranked_continuations(occurrences, scores) if scores or self._stop is not None else []
        self._tree = ranked_trie(root, continuations, self._trie_budget) if continuations else root_alone(root)
        return self._tree

    def _scores(self, context: Sequence[int], occurrences: list[tuple[int, int]], limit: int) -> list[int]:
        """How much context each occurrence of the root (context[-1]) matches."""
        lists = self._lists
        if limit < 2 or len(context) < 2:
            return [_matched_suffix(context, lists[d], p, limit) for d, p in occurrences]
        # Most occurrences of a common root differ at the token before it: they match 1 (an
        # occurrence's token is the root), known without a call.
        before = context[-2]
        return [1 if p and lists[d][p - 1] != before else _matched_suffix(context, lists[d], p, limit) for d, p in occurrences]

    def _ranked_continuations(self, occurrences: list[tuple[int, int]], scores: list[int]) -> list[Continuation]:
        """A trie's continuations, ranked (`rank`): the resynchronising ones (ranked above any
        context matched), then what follows the best `trie_continuations` occurrences, best first
        (in their order where they match alike, most steps). None holds more tokens than the trie
        has nodes: a node's depth is at most its index."""
        config, lists, budget = self.config, self._lists, max(self._trie_budget, 0)
        continuations = []
        if self._stop is not None:
            draft, position = self._stop
            chain_max, rank = min(config.chain_max, budget), config.window_max + 1
            continuations = [
                (lists[draft][position + 2 : position + 2 + chain_max], rank, (draft, position + 2)),
                (lists[draft][position + 1 : position + 1 + chain_max], rank, (draft, position + 1)),
            ]
        if not scores:
            return continuations
        depth, kept = min(config.trie_depth, budget), config.trie_continuations
        if min(scores) == max(scores):
            best = zip(occurrences[:kept], scores)
        else:  # a reversed sort keeps ties in order
            best = [(occurrences[i], scores[i]) for i in sorted(range(len(scores)), key=scores.__getitem__, reverse=True)[:kept]]
        continuations += [(lists[d][p + 1 : p + 1 + depth], score, (d, p + 1)) for (d, p), score in best]
        return continuations

    def _budget_at(self, hit_rate: float) -> int:
        low, high = self.config.trie_budget_min, self.config.trie_budget
        return low + round((high - low) * hit_rate)

    def observe(self, accepted: Sequence[int]) -> None:
        """`accepted`: the draft tokens the target accepted this step (bonus excluded)."""
        # The draft position of the node `accepted` reaches (None: a trie's root)
        copied = self._copied
        if isinstance(copied, tuple):  # a chain: its nodes are the draft's tokens in order
            self._stop = (copied[0], copied[1] + len(accepted))
        else:
            self._stop = ranked_node_source(copied, accepted) if accepted and self._tree is not None else None
        config = self.config
        if self._was_trie and len(self._tree) > 1:
            weight = config.trie_hit_weight
            self._trie_hit_rate = (1 - weight) * self._trie_hit_rate + weight * (len(accepted) > 0)
            self._trie_budget = self._budget_at(self._trie_hit_rate)
        if self._ambiguous:
            self.window = min(self.window + len(accepted), config.window_max)
        else:
            self.window = config.window_min


def normalise(text: str) -> tuple[str, list[int]]:
    """Keep letters, digits, CJK and kana (all `isalnum`); map each kept char to its index."""
    kept = [(ch, i) for i, ch in enumerate(text) if ch.isalnum()]
    return "".join(ch for ch, _ in kept), [i for _, i in kept]


class TextDraftProposer:
    """Matching in a normalised character space, for drafts whose markup differs from the
    output (the page stage with region outputs as drafts).

    The tail of the output is decoded and normalised; its longest suffix (at least
    `min_chars`) found in the normalised drafts gives match points; the original draft text
    after each match point is re-tokenized into a chain. One match -> a chain, several -> a trie.
    """

    kind = "chars"

    def __init__(
        self,
        draft_texts: Sequence[str],
        encode: Callable[[str], list[int]],
        decode: Callable[[Sequence[int]], str],
        config: ProposerConfig = ProposerConfig(),
        min_chars: int = 6,
        max_chars: int = 32,
        tail_tokens: int = 24,
        max_matches: int = 8,
    ):
        self.config = config
        self.encode = encode
        self.decode = decode
        self.min_chars, self.max_chars = min_chars, max_chars
        self.tail_tokens = tail_tokens
        self.max_matches = max_matches
        self.texts: list[str] = []
        self.normalised: list[tuple[str, list[int]]] = []
        for text in draft_texts:
            self._add_text(text)

    def _add_text(self, text: str) -> None:
        if text:
            self.texts.append(text)
            self.normalised.append(normalise(text))

    def add_drafts(self, drafts: Sequence[Sequence[int]]) -> None:
        """More drafts (token ids, matched as their text), from the next step on."""
        for draft in drafts:
            self._add_text(self.decode(draft))

    def start(self) -> None:
        pass  # stateless between steps

    def _match_points(self, key: str) -> list[tuple[int, int]]:
        points = []
        for draft, (norm, _) in enumerate(self.normalised):
            start = norm.find(key)
            while start >= 0 and len(points) <= self.max_matches:
                points.append((draft, start + len(key) - 1))
                start = norm.find(key, start + 1)
        return points

    def _continuation(self, draft: int, norm_end: int, tail: str) -> list[int]:
        text, index = self.texts[draft], self.normalised[draft][1]
        if tail[-1:].isspace():
            # The output already wrote its own separator after the last word: continue at the
            # draft's next word, skipping the draft's markup in between.
            if norm_end + 1 >= len(index):
                return []
            rest = text[index[norm_end + 1] :]
        else:
            rest = text[index[norm_end] + 1 :]
        return self.encode(rest[: self.config.chain_max * 8])[: self.config.chain_max]

    def propose(self, context: Sequence[int]) -> TokenTree:
        root = context[-1]
        tail = self.decode(context[-self.tail_tokens :])
        norm_tail, _ = normalise(tail)
        for length in range(min(self.max_chars, len(norm_tail)), self.min_chars - 1, -1):
            points = self._match_points(norm_tail[-length:])
            if points:
                break
        else:
            return TokenTree.chain(root, ())
        chains = [self._continuation(d, end, tail) for d, end in points[: self.max_matches]]
        chains = [c for c in chains if c]
        if len(chains) == 1:
            return TokenTree.chain(root, chains[0], evidence=length)
        return build_trie(root, [Continuation(c, length) for c in chains], self.config.trie_budget)

    def observe(self, accepted: Sequence[int]) -> None:
        pass
