"""Draft-target matching: turn a set of drafts into a token tree to verify at each step.

Proposers are small CPU objects over plain token lists; they never see a model. Each step the
loop calls `start()` once per sequence, then each step `propose(context)` (context = every token
emitted so far; its last token is the root) and `observe(accepted)` with the draft tokens the
target accepted (bonus excluded).
"""

from __future__ import annotations

import functools
import heapq
import itertools
from os.path import commonprefix
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .tree import TokenTree


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


Source = tuple[int, int] | None  # (draft, position) a proposed token was copied from


@dataclass(slots=True)  # not frozen: a step builds one per matching occurrence, and a frozen one takes twice as long
class Continuation:
    tokens: Sequence[int]
    score: int  # higher is proposed first (how much context the occurrence matched)
    source: Source = None  # where tokens[0] sits in the drafts


def build_trie(root: int, continuations: Sequence[Continuation], budget: int) -> TokenTree:
    """Trie of continuations flattened best-first within `budget` draft nodes; its evidence is the
    best score. A node's draft position is its best continuation's (`node_source`).

    Best-first (by score, then how many continuations share the node) instead of plain
    breadth-first: with a common root token the first level is wide, and a breadth-first cut
    would spend the whole budget there instead of going deep on the best-matching draft.
    Parents are always emitted before their children. A node's children are grouped only when
    the node is taken, so the work follows the budget, not the continuations' length: a node is
    the continuations through it (best first), its score the first one's.
    """
    ranked = sorted(continuations, key=lambda c: -c.score)
    tokens, parents = [root], [-1]
    evidence = ranked[0].score if ranked else 0
    if _all_lone(ranked):  # most tries: no two continuations share a first token
        one_score = not ranked or ranked[0].score == ranked[-1].score
        for group in [ranked] if one_score else (group for _, group in itertools.groupby(ranked, key=lambda c: c.score)):
            if len(tokens) > budget:
                break
            _interleave([(0, c.tokens, 0) for c in group if c.tokens], tokens, parents, budget)
        return TokenTree.built(tokens, parents, evidence)
    # (-score, -continuations through it, serial, parent's index, token, those continuations, depth)
    frontier: list[tuple[int, int, int, int, int, list[Continuation], int]] = []
    serial = 0  # unique tie-breaker so entries are never compared past it

    def push_children(through: list[Continuation], depth: int, index: int) -> None:
        nonlocal serial
        if len(through) == 1:  # one continuation, one child (no grouping)
            if depth < len(through[0].tokens):
                heapq.heappush(frontier, (-through[0].score, -1, serial, index, through[0].tokens[depth], through, depth + 1))
                serial += 1
            return
        children: dict[int, list[Continuation]] = {}
        for item in through:
            if depth < len(item.tokens):
                children.setdefault(item.tokens[depth], []).append(item)
        for token, sharing in children.items():
            heapq.heappush(frontier, (-sharing[0].score, -len(sharing), serial, index, token, sharing, depth + 1))
            serial += 1

    push_children(ranked, 0, 0)
    while frontier and len(tokens) <= budget:
        if frontier[0][1] == -1:
            # The best waiting nodes are lone continuations' of one score: a taken node's child
            # waits with its key and a serial past every other, so they are taken in turn (first
            # in, first out) until they end, before anything else.
            best = frontier[0][0]
            group = sorted(entry for entry in frontier if entry[0] == best)
            frontier[:] = [entry for entry in frontier if entry[0] != best]
            heapq.heapify(frontier)
            turns = [(parent, through[0].tokens, depth - 1) for _, _, _, parent, _, through, depth in group]
            _interleave(turns, tokens, parents, budget)
            continue
        score, count, _, parent_index, token, sharing, depth = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent_index)
        if not frontier or frontier[0][:2] > (score, count):
            # Where the continuations through the node go on alike, its one child would be pushed
            # with this key and a larger serial than any waiting, so popped next, and so on down
            # their common tokens: take them at once (commonprefix compares any sequences).
            rest = commonprefix([list(c.tokens[depth : depth + budget + 1 - len(tokens)]) for c in sharing])
            first = len(tokens)
            tokens.extend(rest)
            parents.extend(range(first - 1, first - 1 + len(rest)))
            depth += len(rest)
        push_children(sharing, depth, len(tokens) - 1)
    return TokenTree.built(tokens, parents, evidence)


def _all_lone(ranked: Sequence[Continuation]) -> bool:
    """Whether no two continuations (with tokens) share a first token: then every node is one
    continuation's, and the heap's order is each score's continuations taken in turn, best score
    first (`_interleave` from the start)."""
    firsts = [c.tokens[0] for c in ranked if c.tokens]
    return len(set(firsts)) == len(firsts)


def _interleave(chains: list[tuple[int, Sequence[int], int]], tokens: list[int], parents: list[int], budget: int) -> None:
    """Take the chains' nodes in turn (one of each, then the next of each, ...) until they end or
    the budget is spent. While the same m chains last, a chain's nodes are every m-th of a block,
    so each block is laid out with a slice assignment per chain, not a step per node."""
    if len(chains) == 1:  # one chain: its nodes in order
        parent, sequence, start = chains[0]
        first = len(tokens)
        tokens.extend(sequence[start : start + budget + 1 - first])
        parents.append(parent)
        parents.extend(range(first, len(tokens) - 1))
        return
    last = [parent for parent, _, _ in chains]  # each chain's latest node (its next node's parent)
    lengths = [len(sequence) - start for _, sequence, start in chains]
    alive, done = list(range(len(chains))), 0  # the chains not ended; the rounds taken
    while alive and len(tokens) <= budget:
        m, room = len(alive), budget + 1 - len(tokens)
        rounds = min(min(lengths[i] for i in alive) - done, -(-room // m))
        base, size = len(tokens), m * rounds
        block_tokens, block_parents = [0] * size, [0] * size
        for slot, i in enumerate(alive):
            _, sequence, start = chains[i]
            block_tokens[slot::m] = sequence[start + done : start + done + rounds]
            block_parents[slot] = last[i]
            block_parents[slot + m :: m] = range(base + slot, base + slot + m * (rounds - 1), m)
            last[i] = base + slot + m * (rounds - 1)
        tokens.extend(block_tokens[:room])
        parents.extend(block_parents[:room])
        done += rounds
        alive = [i for i in alive if lengths[i] > done]


def node_source(continuations: Sequence[Continuation], path: Sequence[int]) -> Source:
    """The draft position of the trie node reached by the tokens `path` below its root: its best
    continuation's (the first ranked whose tokens begin with the path; `build_trie` ranks them by
    score, stably), looked up for the one node a step accepts instead of kept for every node."""
    if not path:
        return None
    depth, path = len(path), list(path)
    best = next(c for c in sorted(continuations, key=lambda c: -c.score) if list(c.tokens[:depth]) == path)
    return None if best.source is None else (best.source[0], best.source[1] + depth - 1)


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
        # What the last tree was copied from: a chain's (draft, position of its root), or a trie's continuations
        self._copied: tuple[int, int] | list[Continuation] = []
        self._stop: Source = None  # draft position of the last accepted draft token
        self._trie_hit_rate = 1.0
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
        output = self._lists[0]
        indexed = max(len(output) - 1, 0)
        output.extend(context[len(output) :])
        for position in range(indexed, len(output) - 1):
            self.occurrences.setdefault(output[position], []).append((0, position))

    def propose(self, context: Sequence[int]) -> TokenTree:
        if self.config.own_output:
            self._index_output(context)
        root = context[-1]
        limit = self.config.window_max
        scored = [(d, p, _matched_suffix(context, self._lists[d], p, limit)) for d, p in self.occurrences.get(root, ())]
        window = min(self.window, len(context))
        full_matches = [item for item in scored if item[2] >= window]
        self._ambiguous = len(full_matches) > 1
        self._was_trie = len(full_matches) != 1
        if len(full_matches) == 1:
            draft, position, matched = full_matches[0]
            chain = self._lists[draft][position + 1 : position + 1 + self.config.chain_max]
            self._tree = TokenTree.chain(root, chain, evidence=matched)
            self._copied = (draft, position)
            return self._tree
        depth = self.config.trie_depth
        # `build_trie` ranks them by score stably: sorted here only where some are left out.
        kept = self.config.trie_continuations
        best = scored if len(scored) <= kept else sorted(scored, key=lambda item: -item[2])[:kept]
        continuations = [Continuation(self._lists[d][p + 1 : p + 1 + depth], score, (d, p + 1)) for d, p, score in best]
        if self._stop is not None:
            draft, position = self._stop
            chain_max, rank = self.config.chain_max, limit + 1
            continuations += [
                Continuation(self._lists[draft][position + 2 : position + 2 + chain_max], rank, (draft, position + 2)),
                Continuation(self._lists[draft][position + 1 : position + 1 + chain_max], rank, (draft, position + 1)),
            ]
        self._tree = build_trie(root, continuations, self._trie_budget()) if continuations else root_alone(root)
        self._copied = continuations
        return self._tree

    def _trie_budget(self) -> int:
        low, high = self.config.trie_budget_min, self.config.trie_budget
        return low + round((high - low) * self._trie_hit_rate)

    def _accepted_source(self, accepted: Sequence[int]) -> Source:
        """The draft position of the last tree's node that `accepted` reaches (None: its root in a trie)."""
        if self._tree is None:
            return None
        if isinstance(self._copied, tuple):  # a chain: its nodes are the draft's tokens in order
            return self._copied[0], self._copied[1] + len(accepted)
        return node_source(self._copied, accepted)

    def observe(self, accepted: Sequence[int]) -> None:
        """`accepted`: the draft tokens the target accepted this step (bonus excluded)."""
        self._stop = self._accepted_source(accepted)
        if self._was_trie and len(self._tree) > 1:
            weight = self.config.trie_hit_weight
            self._trie_hit_rate = (1 - weight) * self._trie_hit_rate + weight * (len(accepted) > 0)
        if self._ambiguous:
            self.window = min(self.window + len(accepted), self.config.window_max)
        else:
            self.window = self.config.window_min


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
