"""Logits rules that read the tokens before a position: repetition, presence and frequency
penalties, and no-repeat n-gram bans. Inside a tree every node has its own history (the row's
prompt and output, then the tokens on the node's path from the root), so every node's logits are
processed with ITS path's tokens; argmax and the keyed sampler then read the processed logits at
every node, bonus included, and the output stays what plain decoding with the same rules emits.

Which tokens each rule reads, and why (the makers' implementations):

- `repetition_penalty` p: prompt + output, as transformers' `RepetitionPenaltyLogitsProcessor`
  (over `generate`'s input_ids, its left padding ignored) and vLLM's: a seen token's logit l
  becomes l * p where l < 0, else l / p.
- `frequency_penalty` f, `presence_penalty` r: the output only, as vLLM's (transformers has
  neither): l - f * count - r * (count > 0), count in the output so far.
- `no_repeat_ngram` n: a token that would complete an n-gram already in the history gets -inf.
  The history is prompt + output with `ngram_over_prompt` (transformers'
  `NoRepeatNGramLogitsProcessor`), else the output only (the vLLM-side processors of MinerU and
  DeepSeek). `ngram_window` w: only n-grams lying wholly in the history's last w tokens count
  (DeepSeek-OCR's `NoRepeatNGramLogitsProcessor`; 0: the whole history). `ngram_allowed`: ids
  never banned (DeepSeek's whitelist, `<td>` and `</td>`).

Order: repetition penalty, then frequency and presence (vLLM's order; transformers' processors
run the repetition penalty before the n-gram ban), then the ban (a -inf commutes with the rest).
Rules run on fp32 logits before temperature, top-k and top-p (`verify.processed_probs`).

The makers' values (recipes set them; nothing here picks one):
- GLM-OCR: repetition_penalty 1.1 (its SDK's config), greedy.
- DeepSeek-OCR-2: no_repeat_ngram 20 in a window of 50, `<td>`/`</td>` ids allowed (their
  tokenizer's 128821, 128822), output only (a vLLM V0 logits processor receives the output
  tokens), greedy (DeepSeek-OCR 1's vLLM recipe: 30 in a window of 90).
- MinerU2.5 (mineru-vl-utils 2.0.7 `DEFAULT_SAMPLING_PARAMS`): presence_penalty 1.0 and
  frequency_penalty 0.05 (tables 0.005), no_repeat_ngram 100 (layout too, penalties off there),
  temperature 0 / top_k 1: greedy. Its vLLM backends apply the n-gram ban to the output only (its
  own `VllmV1NoRepeatNGramLogitsProcessor`); its transformers backend passes
  `no_repeat_ngram_size` to `generate` (prompt + output) and drops presence/frequency.

Every rule off (the default) is no rule at all: the loop then calls nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .tree import TokenTree, tree_layout


@dataclass(frozen=True)
class LogitsRules:
    repetition_penalty: float = 1.0  # 1.0: off; over prompt + output
    presence_penalty: float = 0.0  # over the output
    frequency_penalty: float = 0.0  # over the output
    no_repeat_ngram: int = 0  # n; 0: off
    ngram_window: int = 0  # only n-grams within the history's last `ngram_window` tokens; 0: all of it
    ngram_allowed: tuple[int, ...] = ()  # token ids the ban never bans
    ngram_over_prompt: bool = True  # the ban's history: prompt + output (transformers), else the output

    def __post_init__(self):
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, not {self.repetition_penalty}")
        if self.no_repeat_ngram < 0 or self.ngram_window < 0:
            raise ValueError("no_repeat_ngram and ngram_window must be >= 0")
        if self.ngram_window and self.ngram_window < self.no_repeat_ngram:
            raise ValueError(f"an n-gram of {self.no_repeat_ngram} does not fit a window of {self.ngram_window}")

    @property
    def penalises(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def active(self) -> bool:
        return self.penalises or self.no_repeat_ngram > 0

    @property
    def reads_prompt(self) -> bool:
        return self.repetition_penalty != 1.0 or (self.no_repeat_ngram > 0 and self.ngram_over_prompt)


def path_tokens(tokens: Sequence[int], parents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The tree's non-root tokens (K - 1,) and which of them lie on each node's path from the root,
    the node included: (K, K - 1) bool. The root is the output's last token, already in it."""
    ancestors = tree_layout(parents).ancestors
    return np.asarray(tokens[1:], dtype=np.int64), ancestors[:, 1:]


def penalise_(
    scores: torch.Tensor, tokens: np.ndarray, on_path: np.ndarray, prompt: np.ndarray, output: np.ndarray, rules: LogitsRules
) -> None:
    """Repetition, frequency and presence penalties on (K, V) fp32 `scores`, in place: node i's
    history is prompt + output + the `tokens` where on_path[i]. Only the columns of tokens seen
    anywhere are read and written."""
    repetition = rules.repetition_penalty != 1.0
    vocab = scores.shape[-1]
    columns = np.unique(np.concatenate([output, tokens, prompt] if repetition else [output, tokens]))
    columns = columns[columns < vocab]  # ids past the output layer (some vision tokens) are never picked
    if not columns.size:
        return
    output_counts = np.bincount(np.searchsorted(columns, output[output < vocab]), minlength=columns.size)
    counts = np.repeat(output_counts[None, :].astype(np.float32), len(scores), axis=0)  # (K, C)
    nodes, on = np.nonzero(on_path & (tokens < vocab))  # node i, path node j + 1 on its path
    np.add.at(counts, (nodes, np.searchsorted(columns, tokens[on])), 1.0)
    counts = torch.from_numpy(counts)
    index = torch.from_numpy(columns)
    picked = scores.index_select(1, index)  # (K, C): a gather by advanced indexing costs ten times more
    if repetition:
        seen = (counts > 0) | torch.from_numpy(np.isin(columns, prompt))[None, :]
        penalty = rules.repetition_penalty  # transformers' expression, for the same fp32 rounding
        picked = torch.where(seen, torch.where(picked < 0, picked * penalty, picked / penalty), picked)
    if rules.frequency_penalty != 0.0:
        picked = picked - rules.frequency_penalty * counts
    if rules.presence_penalty != 0.0:
        picked = picked - rules.presence_penalty * (counts > 0).to(picked.dtype)
    scores.index_copy_(1, index, picked)


def suffix_matches(history: np.ndarray, cap: int) -> np.ndarray:
    """(L + 1,): for every e, the length (at most `cap`) of the longest common suffix of
    history[:e] and the whole history. Candidates are narrowed a token at a time, so the cost is
    one pass over the history plus the few places that match its end."""
    length = len(history)
    matched = np.zeros(length + 1, dtype=np.int64)
    matched[length] = min(length, cap)
    alive = np.arange(length)
    for k in range(1, cap + 1):
        alive = alive[alive >= k]
        if not alive.size:
            break
        alive = alive[history[alive - k] == history[length - k]]
        matched[alive] = k
    return matched


def banned_ngram_tokens(tokens: Sequence[int], parents: Sequence[int], history: np.ndarray, rules: LogitsRules) -> list[np.ndarray]:
    """Per node, the token ids that would complete an n-gram already in its history (`history`,
    then its path's tokens), within the window, less the allowed ids. Common-suffix lengths are
    carried from parent to child: appending x, position e matches min(m(e - 1) + 1, n - 1) where
    the token before it is x, else 0; a token at e is banned where m(e) >= n - 1."""
    n, window = rules.no_repeat_ngram, rules.ngram_window
    cap = n - 1
    base = history[-window:] if window else history
    histories: list[np.ndarray] = [base]
    matches: list[np.ndarray] = [suffix_matches(base, cap)]
    allowed = np.asarray(rules.ngram_allowed, dtype=np.int64)
    banned: list[np.ndarray] = []
    for node, parent in enumerate(parents):
        if node:
            x = tokens[node]
            seen = np.append(histories[parent], x)
            matched = np.zeros(len(seen) + 1, dtype=np.int64)
            matched[1:] = np.where(seen == x, np.minimum(matches[parent] + 1, cap), 0)
            histories.append(seen)
            matches.append(matched)
        seen, matched = histories[node], matches[node]
        start = max(cap, len(seen) - window + cap) if window else cap
        hits = seen[start + np.flatnonzero(matched[start : len(seen)] >= cap)]
        banned.append(np.setdiff1d(hits, allowed))  # sorted, unique
    return banned


def apply_rules_(
    logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int], prompt: Sequence[int], output: Sequence[int],
    rules: LogitsRules,
) -> torch.Tensor:
    """A tree's (K, V) node logits, each node's processed with its own history: `prompt`, the
    `output` so far (whose last token is the root's) and its path's tokens; in place where the
    logits are fp32 (returned either way). A root alone is plain decoding's one position."""
    scores = logits if logits.dtype == torch.float32 else logits.float()
    prompt_ids = np.asarray(prompt, dtype=np.int64)
    output_ids = np.asarray(output, dtype=np.int64)
    if rules.penalises:
        on_tokens, on_path = path_tokens(tokens, parents)
        penalise_(scores, on_tokens, on_path, prompt_ids, output_ids, rules)
    if rules.no_repeat_ngram:
        history = np.concatenate([prompt_ids, output_ids]) if rules.ngram_over_prompt else output_ids
        banned = [ids[ids < scores.shape[-1]] for ids in banned_ngram_tokens(tokens, parents, history, rules)]
        rows = np.repeat(np.arange(len(banned)), [len(b) for b in banned])
        if rows.size:
            scores[torch.from_numpy(rows), torch.from_numpy(np.concatenate(banned))] = float("-inf")
    return scores


def processed_logits(
    logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int], prompt: Sequence[int], output: Sequence[int],
    rules: LogitsRules,
) -> torch.Tensor:
    """`apply_rules_` on a copy: the caller's logits stay as they were."""
    return apply_rules_(logits.float().clone(), tokens, parents, prompt, output, rules)


@torch.inference_mode()  # the target's logits are inference tensors: processed in place, in that mode
def rules_on_trees(
    trees: Sequence[TokenTree], logits: torch.Tensor, histories: Sequence[tuple[Sequence[int], Sequence[int]]],
    rules: Sequence[LogitsRules],
) -> torch.Tensor:
    """The (N, V) logits of a batch's valid nodes (row by row, as the target returns them),
    each row's tree processed with its (prompt, output) history and its own `rules` (a row of
    another request decodes by its own makers' rules); in place on fp32 logits."""
    scores = logits if logits.dtype == torch.float32 else logits.float()
    for part, tree, (prompt, output), row_rules in zip(scores.split([len(tree) for tree in trees]), trees, histories, rules):
        if row_rules.active:
            apply_rules_(part, tree.tokens, tree.parents, prompt, output, row_rules)
    return scores


def rules_on_roots(
    logits: torch.Tensor, histories: Sequence[tuple[Sequence[int], Sequence[int]]], rules: Sequence[LogitsRules],
) -> torch.Tensor:
    """(B, V) logits of one position per row (the prefill's first token), processed with each row's
    (prompt, output) history and rules."""
    return rules_on_trees([TokenTree((0,), (-1,))] * len(histories), logits, histories, rules)
