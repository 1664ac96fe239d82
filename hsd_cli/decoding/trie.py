"""Tries of draft continuations: which nodes a step proposes when the drafts continue the context
in several ways, and which draft position the node a step accepted was copied from.

Continuations are `(tokens, score, source)` tuples, `Continuation` naming their fields: a
proposer builds a dozen every step of every row, and a plain tuple is a sixth of an object's cost.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from operator import itemgetter
from os.path import commonprefix
from typing import NamedTuple

from .tree import TokenTree

Source = tuple[int, int] | None  # (draft, position) a proposed token was copied from


class Continuation(NamedTuple):
    tokens: Sequence[int]
    score: int  # higher is proposed first (how much context the occurrence matched)
    source: Source = None  # where tokens[0] sits in the drafts


def rank(continuations: Sequence[Continuation]) -> list[Continuation]:
    """Best score first, in their order within a score (a reversed sort keeps ties stable)."""
    return sorted(continuations, key=itemgetter(1), reverse=True)


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
    return ranked_trie(root, rank([(list(c[0]), c[1], c[2]) for c in continuations]), budget)


def ranked_trie(root: int, ranked: Sequence[Continuation], budget: int) -> TokenTree:
    """`build_trie` of continuations already ranked (`rank`), their tokens lists (a proposer's are
    slices of its drafts)."""
    if len(ranked) < 2:  # a lone occurrence's trie is a chain (every few steps)
        return TokenTree.chain(root, ranked[0][0][: max(budget, 0)], ranked[0][1]) if ranked else TokenTree.built((root,), (-1,))
    best = _best_in_turns(root, ranked, budget)  # most tries (a resynchronising pair)
    if best is not None:
        return best
    if _all_lone(ranked):  # no two continuations share a first token
        return _lone_trie(root, ranked, budget)
    return _heap_trie(root, ranked, budget)


def _best_in_turns(root: int, ranked: Sequence[Continuation], budget: int) -> TokenTree | None:
    """The trie when the best-scored continuations taken in turns fill the budget: each lasts
    that many turns and no other continuation begins with its first token (the heap then takes
    their nodes first, in turns, and nothing else). None where they do not."""
    best, score = 1, ranked[0][1]  # how many continuations have the best score
    while best < len(ranked) and ranked[best][1] == score:
        best += 1
    rounds = -(-budget // best)  # the nodes of each the budget takes
    if best == len(ranked) == 2 and budget > 0:  # a resynchronising pair alone (most tries): its checks spelt out
        first, second = ranked[0][0], ranked[1][0]
        if len(second) < rounds or len(first) < rounds or first[0] == second[0]:
            return None
        tokens = [root] * (budget + 1)
        tokens[1::2], tokens[2::2] = first[:rounds], second[: budget // 2]
        return TokenTree.built(tokens, _turns_parents(2, budget + 1), score)
    if budget <= 0 or min([len(c[0]) for c in ranked[:best]]) < rounds:
        return None
    firsts = [c[0][0] for c in ranked if c[0]]  # the best's first, then the others' (with tokens)
    heads = set(firsts[:best])
    if len(heads) < best or not heads.isdisjoint(firsts[best:]):
        return None
    # One block of turns, a slice assignment per continuation; a node's parent is the node
    # `best` before it, or the root.
    tokens = [root] * (budget + 1)
    for slot, continuation in enumerate(ranked[:best]):
        tokens[1 + slot :: best] = continuation[0][: (budget - slot + best - 1) // best]
    return TokenTree.built(tokens, _turns_parents(best, budget + 1), score)


def _heap_trie(root: int, ranked: Sequence[Continuation], budget: int) -> TokenTree:
    """`ranked_trie` in general: best-first over a heap of nodes (`build_trie`)."""
    tokens, parents = [root], [-1]
    # (-score, -continuations through it, serial, parent's index, token, those continuations, depth)
    frontier: list[tuple[int, int, int, int, int, list[Continuation], int]] = []
    serial = 0  # unique tie-breaker so entries are never compared past it

    def push_children(through: Sequence[Continuation], depth: int, index: int) -> None:
        nonlocal serial
        if len(through) == 1:  # one continuation, one child (no grouping)
            if depth < len(through[0][0]):
                heapq.heappush(frontier, (-through[0][1], -1, serial, index, through[0][0][depth], through, depth + 1))
                serial += 1
            return
        children: dict[int, list[Continuation]] = {}
        for item in through:
            if depth < len(item[0]):
                sharing = children.get(item[0][depth])  # not setdefault: it builds a list per call
                if sharing is None:
                    children[item[0][depth]] = [item]
                else:
                    sharing.append(item)
        for token, sharing in children.items():
            heapq.heappush(frontier, (-sharing[0][1], -len(sharing), serial, index, token, sharing, depth + 1))
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
            _interleave([(parent, through[0][0], depth - 1) for _, _, _, parent, _, through, depth in group], tokens, parents, budget)
            continue
        score, count, _, parent_index, token, sharing, depth = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent_index)
        if not frontier or frontier[0][:2] > (score, count):
            # Where the continuations through the node go on alike, its one child would be pushed
            # with this key and a larger serial than any waiting, so popped next, and so on down
            # their common tokens: take them at once (`commonprefix` compares lists).
            rest = commonprefix([c[0][depth : depth + budget + 1 - len(tokens)] for c in sharing])
            first = len(tokens)
            tokens += rest
            parents += range(first - 1, first - 1 + len(rest))
            depth += len(rest)
        push_children(sharing, depth, len(tokens) - 1)
    return TokenTree.built(tokens, parents, ranked[0][1])


def _all_lone(ranked: Sequence[Continuation]) -> bool:
    """Whether no two continuations (with tokens) share a first token: then every node is one
    continuation's, and the heap's order is each score's continuations taken in turn, best score
    first (`_lone_trie`)."""
    firsts = [c[0][0] for c in ranked if c[0]]
    return len(firsts) < 2 or len(set(firsts)) == len(firsts)


def _lone_trie(root: int, ranked: Sequence[Continuation], budget: int) -> TokenTree:
    """The trie of continuations no two of which share a first token: each score's continuations
    (chains below the root) taken in turn, best score first, until the budget is spent."""
    tokens, parents = [root], [-1]
    start = 0
    while start < len(ranked) and len(tokens) <= budget:
        end, score = start + 1, ranked[start][1]
        while end < len(ranked) and ranked[end][1] == score:
            end += 1
        chains = [(0, c[0], 0) for c in ranked[start:end] if c[0]]
        if chains:
            _interleave(chains, tokens, parents, budget)
        start = end
    return TokenTree.built(tokens, parents, ranked[0][1])


@functools.lru_cache(maxsize=1024)
def _turns_parents(chains: int, size: int) -> tuple[int, ...]:
    """The parents of `size` nodes taken in turns from `chains` chains below the root."""
    return (-1, *[0] * min(chains, size - 1), *range(1, size - chains))


def _interleave(chains: list[tuple[int, Sequence[int], int]], tokens: list[int], parents: list[int], budget: int) -> None:
    """Take the chains' nodes in turn (one of each, then the next of each, ...) until they end or
    the budget (not yet spent) is. A chain is (its first node's parent, a sequence, where in it
    the chain starts, with a node left there); one or more. While the same m chains last, a
    chain's nodes are every m-th of a block, so a block is laid out with a slice assignment per
    chain, not a step per node; past its first m, a block node's parent is the node m before it."""
    room, m = budget + 1 - len(tokens), len(chains)
    if m == 1:  # one chain: its nodes in order
        parent, sequence, start = chains[0]
        first = len(tokens)
        tokens += sequence[start : start + room]
        parents.append(parent)
        parents += range(first, len(tokens) - 1)
        return
    # Turns of every chain until the shortest ends or the budget is spent
    rounds = min(-(-room // m), min([len(sequence) - start for _, sequence, start in chains]))
    block, base = [0] * (m * rounds), len(tokens)
    for slot, (_, sequence, start) in enumerate(chains):
        block[slot::m] = sequence[start : start + rounds]
    tokens += block[:room]
    parents += [parent for parent, _, _ in chains][:room]
    parents += range(base, base + min(m * rounds, room) - m)
    if m * rounds < room:  # the shortest ended: the others go on in turns from their last nodes
        end = base + m * (rounds - 1)  # the last round's first node
        rest = [(end + slot, sequence, start + rounds) for slot, (_, sequence, start) in enumerate(chains) if len(sequence) - start > rounds]
        if rest:
            _interleave(rest, tokens, parents, budget)


def node_source(continuations: Sequence[Continuation], path: Sequence[int]) -> Source:
    """The draft position of the trie node reached by the tokens `path` below its root: its best
    continuation's (the first ranked whose tokens begin with the path; `build_trie` ranks them by
    score, stably), looked up for the one node a step accepts instead of kept for every node."""
    return ranked_node_source(rank([(list(c[0]), c[1], c[2]) for c in continuations]), path)


def ranked_node_source(ranked: Sequence[Continuation], path: Sequence[int]) -> Source:
    """`node_source` among continuations already ranked (`rank`), their tokens lists."""
    if not path:
        return None
    depth, path = len(path), list(path)
    source = next(c[2] for c in ranked if c[0][:depth] == path)
    return None if source is None else (source[0], source[1] + depth - 1)

